// The safetensors checkpoint format (Hugging Face): reading memory-mapped files and sharded sets,
// writing single files and sharded exports. The element types (DType, dtype_size, dtype_name,
// parse_dtype) and the fp32 <-> F16/BF16 conversions (f32_to, to_f32) are titan:: names from
// core/dtype.h, found unqualified inside titan::ckpt.
//
// A file is [u64 little-endian N][N bytes of JSON header, UTF-8][data buffer]. The header maps
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end)}, offsets relative to the
// start of the data buffer; an optional "__metadata__" entry is a flat string -> string map.
// A sharded set is model-0000i-of-0000n.safetensors plus model.safetensors.index.json
// ({"metadata": {"total_size": ...}, "weight_map": {name: shard file}}).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/core/tensor_source.h"

namespace titan {
class Progress;
}

namespace titan::ckpt {

// One tensor inside a mapped file. `data` points into the mapping (no alignment guaranteed) and
// stays valid while the SafetensorsFile / SafetensorsSet that owns it is alive.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // [] for a scalar
  const uint8_t* data;
  size_t nbytes;
  int64_t numel() const;
};

// One memory-mapped safetensors file, fully validated on open (offsets, sizes, overlaps,
// duplicate names, dtypes, metadata); every failure is a titan::Error naming the file and, where
// there is one, the tensor. Move-only; unmaps in the destructor.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // Sorted by name.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // The whole file as mapped (for checksums).
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(map_); }
  size_t size() const { return map_size_; }

 private:
  SafetensorsFile() = default;
  void parse_header(const std::string& header, const uint8_t* data, size_t data_size);

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of one model: `path` is a directory holding model.safetensors (preferred, as
// Transformers does) or model.safetensors.index.json plus its shards, a single .safetensors file,
// or an *.index.json file. Every shard is opened and validated, and the index is checked against
// the shards (every listed tensor present in its shard, no tensor in two shards).
class SafetensorsSet final : public TensorSource {
 public:
  static SafetensorsSet open(const std::string& path);

  std::vector<std::string> names() const override;        // sorted
  const TensorView* find(const std::string& name) const;  // nullptr if absent
  // Copies elements [begin, end) of tensor `name` converted to fp32 into dst (read_f32: all of
  // them). Throws titan::Error naming the file and tensor if it is absent, if its shape differs
  // from `shape`, if its dtype is not F32/F16/BF16/F64, or if the range is not within it.
  void read_f32_range(const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                      int64_t end, float* dst) const override;
  const std::vector<int64_t>* shape_of(const std::string& name) const override {
    const TensorView* t = find(name);
    return t ? &t->shape : nullptr;
  }
  // Sum of the tensors' data bytes.
  int64_t total_bytes() const;
  // The file holding tensor `name` ("" if absent), and the path the set was opened from.
  const std::string& file_of(const std::string& name) const;
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Counts the bytes of every later read_f32(_range) (nullptr: off).
  void set_progress(Progress* p) const { progress_ = p; }

 private:
  mutable Progress* progress_ = nullptr;
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, size_t>> index_;  // name -> (file, tensor)
};

struct WriteTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel * dtype_size(dtype) bytes, already in dtype
  // Set instead of data: writes elements [first, first + count) of the tensor, in dtype, to dst
  // (a scratch buffer of at most 64 MiB) when their turn comes, so that a tensor converted on
  // the way out is never held whole.
  std::function<void(int64_t first, int64_t count, void* dst)> fill = nullptr;
};

// Writes one file: tensors sorted by name and contiguous, the header padded with spaces so the
// data starts 8-byte aligned, metadata with "format": "pt" unless the caller sets "format".
// Writes path + ".tmp-<pid>", fsyncs, then renames over path; on any failure removes the temp
// file and throws titan::Error.
void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                std::map<std::string, std::string> metadata = {});

// Writes a model export into dir (created if needed): dir/model.safetensors if the data fits in
// max_shard_bytes, else shards dir/model-0000i-of-0000n.safetensors (greedy in name order, a
// tensor never split; one larger than the limit gets a shard of its own) plus
// dir/model.safetensors.index.json. All new files are written under temp names first and renamed
// into place only once every one is complete; then the files of an earlier export in dir that
// the new one does not overwrite (model.safetensors, model-*-of-*.safetensors, the index) are
// removed. A failure before the renames leaves the earlier export untouched.
void write_model(const std::string& dir, const std::vector<WriteTensor>& tensors,
                 int64_t max_shard_bytes, std::map<std::string, std::string> metadata = {});

}  // namespace titan::ckpt
