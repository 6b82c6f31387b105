// The backend registry; see backend.h.
#include "titan/ops/backend.h"

#include <map>
#include <memory>
#include <utility>

#include "titan/core/error.h"
#include "titan/ops/device.h"

namespace titan::ops {
namespace {

using Key = std::pair<std::string, std::string>;              // (device, dtype)
using Table = std::map<Key, std::unique_ptr<const Backend>>;  // node-stable: lookups hand out refs

void add(Table& t, const Backend& b) {
  const std::string what = b.device + "/" + b.dtype;
  const std::vector<std::string> miss = b.missing();
  if (!miss.empty()) {
    std::string names;
    for (const auto& m : miss) names += (names.empty() ? "" : ", ") + m;
    throw Error("backend " + what + " is incomplete: no " + names);
  }
  check(!t.count({b.device, b.dtype}), "a backend for " + what + " is already registered");
  t.emplace(Key{b.device, b.dtype}, std::make_unique<const Backend>(b));
}

// Registration happens at start-up (built-ins on first use, then plugins), before any lookup from
// worker threads; the table is not locked.
Table& table() {
  static Table t = [] {
    Table init;
    for (const Backend& b : builtin_backends()) add(init, b);
    return init;
  }();
  return t;
}

}  // namespace

std::vector<std::string> Backend::missing() const {
  std::vector<std::string> m;
  auto need = [&](bool present, const char* name) {
    if (!present) m.emplace_back(name);
  };
  need(alloc, "alloc");
  need(free, "free");
  need(copy, "copy");
  need(memset, "memset");
  const bool some = reserve || commit || decommit, all = reserve && commit && decommit;
  if (some && !all) {  // optional, but as a set
    need(reserve, "reserve");
    need(commit, "commit");
    need(decommit, "decommit");
  }
  need(embedding_fwd, "embedding_fwd");
  need(embedding_bwd, "embedding_bwd");
  need(embedding_fwd_range, "embedding_fwd_range");
  need(embedding_bwd_range, "embedding_bwd_range");
  need(rmsnorm_fwd, "rmsnorm_fwd");
  need(rmsnorm_bwd, "rmsnorm_bwd");
  need(rope_table, "rope_table");
  need(first_bad_position, "first_bad_position");
  need(swiglu_fwd, "swiglu_fwd");
  need(swiglu_bwd, "swiglu_bwd");
  need(add, "add");
  need(add_inplace, "add_inplace");
  need(scale_inplace, "scale_inplace");
  need(copy_rows, "copy_rows");
  need(sum_rows, "sum_rows");
  need(dropout, "dropout");
  need(dropout_add, "dropout_add");
  need(gemm, "gemm");
  need(linear_fwd, "linear_fwd");
  need(linear_bwd, "linear_bwd");
  need(attention_segments, "attention_segments");
  need(attention_fwd, "attention_fwd");
  need(attention_bwd, "attention_bwd");
  need(attention_cached, "attention_cached");
  need(attention_workspace, "attention_workspace");
  need(lm_head_ce, "lm_head_ce");
  need(lm_head_ce_vocab_parallel, "lm_head_ce_vocab_parallel");
  need(router_fwd, "router_fwd");
  need(router_bwd, "router_bwd");
  need(topk_rows, "topk_rows");
  need(count_experts, "count_experts");
  need(router_aux_stats, "router_aux_stats");
  need(expert_bias_update, "expert_bias_update");
  if (dtype == "bfloat16") {
    need(to_bf16, "to_bf16");
    need(from_bf16, "from_bf16");
    need(linear_fwd_bf16, "linear_fwd_bf16");
    need(linear_bwd_bf16, "linear_bwd_bf16");
    need(lm_head_ce_bf16, "lm_head_ce_bf16");
  }
  return m;
}

void register_backend(const Backend& b) { add(table(), b); }

DeviceMemory Backend::memory() const {
  return ops::device(device).host ? DeviceMemory{} : DeviceMemory{alloc,   free,   copy,    memset,
                                                                  reserve, commit, decommit};
}

const Backend& backend(const std::string& device, const std::string& dtype) {
  const Table& t = table();
  auto it = t.find({device, dtype});
  if (it != t.end()) return *it->second;
  std::string have;
  for (const auto& name : registered_backends()) have += (have.empty() ? "" : ", ") + name;
  throw Error("no backend for " + device + "/" + dtype + "; registered: " + have);
}

std::vector<std::string> registered_backends() {
  std::vector<std::string> names;
  for (const auto& [key, b] : table()) names.push_back(key.first + "/" + key.second);
  return names;
}

}  // namespace titan::ops
