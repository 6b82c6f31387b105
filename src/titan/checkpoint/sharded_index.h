// The sharded checkpoint layout (checkpointer.h): shard file names, the slices of parameters a
// shard holds, the runs of checkpoint.index.json's entries, and ShardedDir, a sharded step
// directory opened for reading. Internal to the checkpoint code.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/model.h"

namespace titan::ckpt::detail {

std::string shard_file_name(int64_t rank, int64_t shards);

// A parameter's part of a shard: elements [begin, end) of the data held for it (the whole
// tensor, or its tensor/expert-parallel slice, flattened), at element `at` of the shard's buffers.
struct Slice {
  const models::ParamInfo* p;
  int64_t begin, end, at;
};

// The slices of the (non-alias) parameters that the segments hold.
std::vector<Slice> slices_in(const models::Model& model, const Segments& segs);

int64_t numel_of(const std::vector<int64_t>& shape);

// fn(p) for every (non-alias) parameter; with unit_done, unit by unit, unit_done(u) after each.
template <typename Fn>
void for_each_unit(const models::Model& model, const UnitDone& unit_done, Fn&& fn) {
  const int64_t units = unit_done ? static_cast<int64_t>(model.store().units().size()) : 1;
  for (int64_t u = 0; u < units; ++u) {
    for (const auto& p : model.params())
      if (!p.alias && (!unit_done || p.group == u)) fn(p);
    if (unit_done) unit_done(u);
  }
}

// The index entries of one file's elements of a tensor: elements [begin, begin + len) of the
// flattened tensor at element `at` of the file's 1-D tensor, then `count` such runs, run i at
// begin + i·stride in the tensor and at + i·len in the file. JSON: [file, begin, end] (at 0, one
// run: FSDP's ranges) or [file, begin, end, at, count, stride] (a tensor-parallel slice's rows).
struct RunGroup {
  int64_t begin = 0, len = 0, at = 0, count = 1, stride = 0;
  nlohmann::json to_json(const std::string& file) const {
    if (at == 0 && count == 1) return nlohmann::json::array({file, begin, begin + len});
    return nlohmann::json::array({file, begin, begin + len, at, count, stride});
  }
};

// The runs of the whole tensor that elements [a, z) of the data held for p (its slice) fill, as
// groups: fn(group), where group.at counts from a.
template <typename Fn>
void run_groups(const models::ParamInfo& p, int64_t a, int64_t z, Fn&& fn) {
  RunGroup g;
  bool open = false;
  models::for_each_whole_run(p, a, z, [&](int64_t w, int64_t l, int64_t n) {
    if (open && n == g.len &&
        (g.count == 1 ? w > g.begin + g.len - 1 : w == g.begin + g.count * g.stride)) {
      if (g.count == 1) g.stride = w - g.begin;
      ++g.count;
      return;
    }
    if (open) fn(g);
    g = {w, n, l - a, 1, 0};
    open = true;
  });
  if (open) fn(g);
}

// A sharded step directory's index and its files, opened and checked against checksums.json.
class ShardedDir {
 public:
  ShardedDir(const std::string& dir, const std::optional<std::map<std::string, FileSum>>& sums);

  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

  // dst[0 : hi − lo) = elements [lo, hi) of tensor `name` (flattened), whose shape must be `shape`.
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t lo, int64_t hi,
            float* dst) const {
    copy_range(entry(name, shape), name, lo, hi, dst);
  }

  // Elements [a, z) of the data held for parameter p (its slice in a tensor/expert-parallel
  // model) of tensor `name` (p's, or a moment's) into dst.
  void read_held(const std::string& name, const models::ParamInfo& p, int64_t a, int64_t z,
                 float* dst) const {
    const Entry& e = entry(name, p.shape);
    models::for_each_whole_run(p, a, z, [&](int64_t w, int64_t l, int64_t n) {
      copy_range(e, name, w, w + n, dst + (l - a));
    });
  }

  // The model's parameters (whole, or the slices it holds; unit by unit with unit_done) and
  // buffers (those the index has).
  void read_weights(models::Model& model, const UnitDone& unit_done = {}) const {
    for_each_unit(model, unit_done, [&](const models::ParamInfo& p) {
      read_held(p.fqn, p, 0, p.numel, model.store().param_data() + p.offset);
    });
    for (const auto& b : model.buffers())
      if (has(b.fqn)) read(b.fqn, b.shape, 0, numel_of(b.shape), b.data);
  }

 private:
  struct Entry;
  // Tensor `name` of the index, whose shape must be `shape`.
  const Entry& entry(const std::string& name, const std::vector<int64_t>& shape) const;
  // dst[0 : hi − lo) = elements [lo, hi) of e (tensor `name`), from the runs that hold them.
  void copy_range(const Entry& e, const std::string& name, int64_t lo, int64_t hi,
                  float* dst) const;

  struct Run {  // elements [begin, end) of the tensor, at element `at` of its tensor in file
    const SafetensorsFile* file;
    int64_t begin, end, at;
  };
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<Run> runs;  // sorted by begin
  };
  std::string dir_, index_path_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace titan::ckpt::detail
