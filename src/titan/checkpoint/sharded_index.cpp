// The sharded checkpoint layout: shard file names, the slices of parameters a shard holds, and
// ShardedDir, which reads checkpoint.index.json and its shard files.
#include "titan/checkpoint/sharded_index.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "titan/checkpoint/step_dir.h"
#include "titan/core/error.h"

namespace titan::ckpt::detail {
namespace fs = std::filesystem;
using nlohmann::json;

std::string shard_file_name(int64_t rank, int64_t shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05lld-of-%05lld.safetensors", static_cast<long long>(rank),
                static_cast<long long>(shards));
  return buf;
}

std::vector<Slice> slices_in(const models::Model& model, const Segments& segs) {
  std::vector<Slice> r;
  int64_t base = 0;
  for (const FlatRange& sg : segs) {
    for (const auto& p : model.params()) {
      const int64_t a = std::max(sg.begin, p.offset),
                    z = std::min(sg.begin + sg.len, p.offset + p.numel);
      if (!p.alias && a < z) r.push_back({&p, a - p.offset, z - p.offset, base + a - sg.begin});
    }
    base += sg.len;
  }
  return r;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ShardedDir::ShardedDir(const std::string& dir,
                       const std::optional<std::map<std::string, FileSum>>& sums)
    : dir_(dir), index_path_((fs::path(dir) / kShardedIndexName).string()) {
  const json idx = read_json(index_path_);
  check(idx.is_object() && idx.value("format", json()) == "titan-sharded-checkpoint",
        index_path_ + ": \"format\" must be \"titan-sharded-checkpoint\"");
  const json version = idx.value("version", json());
  check(version == 1 || version == 2, index_path_ + ": version " + version.dump() +
                                          " is not supported (this titan reads versions 1 and 2)");
  check(idx.contains("tensors") && idx["tensors"].is_object(),
        index_path_ + ": \"tensors\" must be an object");
  for (const auto& [name, e] : idx["tensors"].items()) {
    const std::string at = index_path_ + ": tensor '" + name + "'";
    check(e.is_object() && e.contains("shape") && e["shape"].is_array() && e.contains("slices") &&
              e["slices"].is_array(),
          at + " must have \"shape\" and \"slices\"");
    Entry& t = tensors_[name];
    for (const auto& d : e["shape"]) {
      check(d.is_number_integer() && d.get<int64_t>() >= 0, at + ": bad \"shape\"");
      t.shape.push_back(d.get<int64_t>());
    }
    const int64_t numel = numel_of(t.shape);
    for (const auto& sl : e["slices"]) {
      const bool strided = version == 2 && sl.is_array() && sl.size() == 6;
      bool ok = sl.is_array() && (sl.size() == 3 || strided) && sl[0].is_string();
      for (size_t i = 1; ok && i < sl.size(); ++i) ok = sl[i].is_number_integer();
      check(ok, at + ": every slice must be [file, begin, end]" +
                    std::string(version == 2 ? " or [file, begin, end, at, count, stride]" : ""));
      const std::string file = sl[0].get<std::string>();
      check(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
            at + ": '" + file + "' is not a file name");
      RunGroup g;
      g.begin = sl[1].get<int64_t>();
      g.len = sl[2].get<int64_t>() - g.begin;
      if (strided) {
        g.at = sl[3].get<int64_t>();
        g.count = sl[4].get<int64_t>();
        g.stride = sl[5].get<int64_t>();
      }
      // Divisions, not products, so that no value of the file can overflow.
      check(
          numel > 0 && g.begin >= 0 && g.len > 0 && g.begin <= numel - g.len && g.at >= 0 &&
              g.count >= 1 &&
              (g.count == 1 ||
               (g.stride >= g.len && g.count - 1 <= (numel - g.len - g.begin) / g.stride)),
          at + ": slice " + sl.dump() + " lies outside its " + std::to_string(numel) + " elements");
      auto f = files_.find(file);
      if (f == files_.end()) {
        const std::string path = (fs::path(dir) / file).string();
        check(!sums || sums->count(file), path + ": not listed in " + std::string(kChecksumsName) +
                                              "; the directory was changed after it was saved");
        f = files_.emplace(file, SafetensorsFile::open(path)).first;
      }
      // The runs must lie in the file's data (so their number is bounded by its size).
      const int64_t held = static_cast<int64_t>(f->second.size() / sizeof(float));
      check(g.at <= held && g.count <= (held - g.at) / g.len,
            at + ": slice " + sl.dump() + " holds more elements than " + f->second.path() + " has");
      for (int64_t i = 0; i < g.count; ++i)
        t.runs.push_back(
            {&f->second, g.begin + i * g.stride, g.begin + i * g.stride + g.len, g.at + i * g.len});
    }
    // The slices must cover the tensor exactly once.
    std::sort(t.runs.begin(), t.runs.end(),
              [](const Run& a, const Run& b) { return a.begin < b.begin; });
    int64_t next = 0;
    for (const auto& r : t.runs) {
      check(r.begin == next,
            at + ": its slices leave a gap or overlap at element " + std::to_string(next));
      next = r.end;
    }
    check(next == numel, at + ": its slices cover " + std::to_string(next) + " of its " +
                             std::to_string(numel) + " elements");
  }
  if (sums) {  // every listed file, the shards hashed from the mappings just opened
    std::map<std::string, Mapped> mapped;
    for (const auto& [name, f] : files_) mapped[name] = {f.bytes(), f.size()};
    verify_checksums(dir, mapped);
  }
}

const ShardedDir::Entry& ShardedDir::entry(const std::string& name,
                                           const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  check(it != tensors_.end(), index_path_ + " lacks tensor '" + name + "'");
  check(it->second.shape == shape, index_path_ + ": tensor '" + name + "' has shape " +
                                       json(it->second.shape).dump() + ", the model's is " +
                                       json(shape).dump());
  return it->second;
}

void ShardedDir::copy_range(const Entry& e, const std::string& name, int64_t lo, int64_t hi,
                            float* dst) const {
  auto r = std::upper_bound(e.runs.begin(), e.runs.end(), lo,
                            [](int64_t x, const Run& run) { return x < run.end; });
  for (; r != e.runs.end() && r->begin < hi; ++r) {
    const int64_t a = std::max(lo, r->begin), z = std::min(hi, r->end);
    const TensorView* t = r->file->find(name);
    check(t != nullptr && (t->dtype == DType::F32 || t->dtype == DType::BF16) &&
              t->shape.size() == 1 && t->shape[0] >= r->at + (r->end - r->begin),
          r->file->path() + ": tensor '" + name + "' must be F32 (or BF16) of at least " +
              std::to_string(r->at + r->end - r->begin) + " elements as " + kShardedIndexName +
              " says");
    to_f32(t->dtype, t->data + (r->at + a - r->begin) * dtype_size(t->dtype), z - a,
           dst + (a - lo));
  }
}

}  // namespace titan::ckpt::detail
