// The native (titan) checkpoint format: the model's tensors as written, and reading weights and
// AdamW moments from safetensors sets (verified against checksums.json); load_model_weights and
// load_model_and_adapter.
#include "titan/checkpoint/native.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "titan/checkpoint/sharded_index.h"
#include "titan/core/error.h"
#include "titan/core/log.h"
#include "titan/core/progress.h"

namespace titan::ckpt {
namespace fs = std::filesystem;
using namespace detail;

namespace detail {
namespace {

// The files of the sets that lie in dir, by name.
std::map<std::string, const SafetensorsFile*> files_in(
    const std::string& dir, std::initializer_list<const SafetensorsSet*> sets) {
  std::map<std::string, const SafetensorsFile*> r;
  std::error_code ec;
  const fs::path d = fs::weakly_canonical(dir, ec);
  for (const SafetensorsSet* set : sets)
    for (const auto& f : set->files()) {
      const fs::path p(f.path());
      std::error_code pec;
      if (!ec && fs::weakly_canonical(p.parent_path(), pec) == d && !pec)
        r[p.filename().string()] = &f;
    }
  return r;
}

void check_params_present(const models::Model& model, const SafetensorsSet& set,
                          const std::string& path) {
  std::vector<std::string> missing;
  for (const auto& p : model.params())
    if (!p.alias && !set.find(p.fqn)) missing.push_back(p.fqn);
  check(missing.empty(), path + ": native checkpoint lacks " + std::to_string(missing.size()) +
                             " parameter(s), e.g. '" + (missing.empty() ? "" : missing[0]) +
                             "'; for a Hugging Face directory set checkpoint.initial_load_in_hf");
}

}  // namespace

WriteTensor weight_tensor(const models::ParamStore& store, std::string name,
                          std::vector<int64_t> shape, int64_t offset, DType dt) {
  if (dt == DType::F32 && !store.masters_released())
    return {std::move(name), dt, std::move(shape), store.param_data() + offset};
  auto fill = [&store, offset, dt](int64_t first, int64_t count, void* dst) {
    if (dt == DType::F32)
      return store.read_weights(offset + first, count, static_cast<float*>(dst));
    constexpr int64_t kChunk = int64_t{1} << 20;  // fp32 elements converted at a time
    std::vector<float> f32(static_cast<size_t>(std::min(count, kChunk)));
    for (int64_t i = 0; i < count; i += kChunk) {
      const int64_t k = std::min(kChunk, count - i);
      store.read_weights(offset + first + i, k, f32.data());
      f32_to(dt, f32.data(), k, static_cast<uint8_t*>(dst) + i * dtype_size(dt));
    }
  };
  return {std::move(name), dt, std::move(shape), nullptr, fill};
}

std::vector<WriteTensor> model_tensors(const models::Model& model, DType dt, bool hf_keys) {
  std::vector<WriteTensor> out;
  if (hf_keys) {
    for (const auto& t : model.hf().hf_tensors())
      out.push_back(weight_tensor(model.store(), t.key, t.shape, t.offset, dt));
    return out;
  }
  for (const auto& p : model.params())
    if (!p.alias) out.push_back(weight_tensor(model.store(), p.fqn, p.shape, p.offset, dt));
  for (const auto& b : model.buffers()) {  // MoE expert bias
    if (dt == DType::F32) {
      out.push_back({b.fqn, dt, b.shape, b.data});
      continue;
    }
    const float* src = b.data;
    out.push_back({b.fqn, dt, b.shape, nullptr, [src, dt](int64_t first, int64_t count, void* dst) {
                     f32_to(dt, src + first, count, dst);
                   }});
  }
  return out;
}

std::optional<std::map<std::string, FileSum>> precheck_dir(const std::string& dir) {
  auto sums = read_checksums(dir);
  if (!sums) {
    log::warn(dir + " has no " + kChecksumsName +
              " (written by an older titan or another tool); its files are not verified");
    return sums;
  }
  std::set<std::string> all;
  for (const auto& [name, s] : *sums) all.insert(name);
  verify_checksums(dir, {}, all);
  return sums;
}

void verify_rest(const std::string& dir, const std::optional<std::map<std::string, FileSum>>& sums,
                 std::initializer_list<const SafetensorsSet*> sets) {
  if (!sums) return;
  std::set<std::string> streamed;
  for (const auto& [name, f] : files_in(dir, sets)) {
    check(sums->count(name), f->path() + ": not listed in " + kChecksumsName +
                                 "; the directory was changed after it was saved");
    streamed.insert(name);
  }
  verify_checksums(dir, {}, streamed);
}

void read_native(const SafetensorsSet& set, const std::vector<Want>& wants,
                 const std::optional<std::map<std::string, FileSum>>& sums) {
  std::vector<std::vector<TensorRead>> per_file(set.files().size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < set.files().size(); ++i) index[set.files()[i].path()] = i;
  for (const auto& w : wants) {
    const TensorView* t = set.find(w.name);
    check(t != nullptr, set.path() + ": tensor '" + w.name + "' not found");
    const std::string& file = set.file_of(w.name);
    const std::string at = file + ": tensor '" + w.name + "'";
    auto shape_str = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    check(t->shape == w.shape,
          at + " has shape " + shape_str(t->shape) + ", expected " + shape_str(w.shape));
    check(t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16 ||
              t->dtype == DType::F64,
          at + " has dtype " + dtype_name(t->dtype) +
              "; only F32, F16, BF16 and F64 convert to fp32");
    per_file[index.at(file)].push_back({t, w.dst});
  }
  int64_t total = 0;
  for (const auto& f : set.files()) total += static_cast<int64_t>(f.size());
  Progress progress("loading " + set.path(), total);
  for (size_t i = 0; i < set.files().size(); ++i) {
    const SafetensorsFile& f = set.files()[i];
    const FileSum* sum = nullptr;
    if (sums) {
      auto it = sums->find(fs::path(f.path()).filename().string());
      if (it != sums->end()) sum = &it->second;
    }
    read_verified(f.path(), f.bytes(), f.size(), std::move(per_file[i]), sum, &progress);
  }
}

void read_held(const SafetensorsSet& set, const std::string& name, const models::ParamInfo& p,
               int64_t a, int64_t z, float* dst) {
  models::for_each_whole_run(p, a, z, [&](int64_t w, int64_t l, int64_t len) {
    set.read_f32_range(name, p.shape, w, w + len, dst + (l - a));
  });
}

void read_weights_held(models::Model& model, const SafetensorsSet& weights, const std::string& dir,
                       const std::optional<std::map<std::string, FileSum>>& sums,
                       const UnitDone& unit_done,
                       std::initializer_list<const SafetensorsSet*> sets) {
  if (sums) {
    std::map<std::string, Mapped> mapped;
    for (const auto& [name, f] : files_in(dir, sets)) mapped[name] = {f->bytes(), f->size()};
    verify_checksums(dir, mapped);
  }
  check_params_present(model, weights, dir);
  for_each_unit(model, unit_done, [&](const models::ParamInfo& p) {
    read_held(weights, p.fqn, p, 0, p.numel, model.store().param_data() + p.offset);
  });
  for (const auto& b : model.buffers())
    if (weights.find(b.fqn)) weights.read_f32(b.fqn, b.shape, b.data);
}

void read_weights(models::Model& model, const SafetensorsSet& set, const std::string& path, bool hf,
                  const std::optional<std::map<std::string, FileSum>>& sums, const Segments* only) {
  if (hf) {
    Progress progress("loading " + path, set.total_bytes());
    set.set_progress(&progress);
    try {
      model.hf().load_hf(set, path, only);
    } catch (...) {
      set.set_progress(nullptr);
      throw;
    }
    set.set_progress(nullptr);
    return;
  }
  if (std::any_of(model.params().begin(), model.params().end(),
                  [](const models::ParamInfo& p) { return p.split_dim >= 0; })) {
    read_weights_held(model, set, path, sums, {}, {&set});
    return;
  }
  check_params_present(model, set, path);
  std::vector<Want> wants;
  for (const auto& p : model.params())
    if (!p.alias) wants.push_back({p.fqn, p.shape, model.store().param_data() + p.offset});
  for (const auto& b : model.buffers())  // absent in a model-only export: stays zero
    if (set.find(b.fqn)) wants.push_back({b.fqn, b.shape, b.data});
  read_native(set, wants, sums);
}

}  // namespace detail

void load_model_weights(models::Model& model, const std::string& path, bool hf, bool verify,
                        const Segments* only) {
  std::error_code ec;
  std::optional<std::map<std::string, FileSum>> sums;
  if (verify && fs::is_directory(path, ec) && fs::exists(fs::path(path) / kChecksumsName, ec))
    sums = precheck_dir(path);
  if (!hf && fs::exists(fs::path(path) / kShardedIndexName, ec)) {
    ShardedDir(path, sums).read_weights(model);
    return;
  }
  // Adapters (PEFT's adapter_model.safetensors) in a directory: that file.
  const bool adapter =
      hf && model.hf().hf_weights_file() != "model.safetensors" && fs::is_directory(path, ec);
  SafetensorsSet set = SafetensorsSet::open(
      adapter ? (fs::path(path) / model.hf().hf_weights_file()).string() : path);
  if (sums && hf) {  // the model reads in its own order: check first, hashing the mappings
    std::map<std::string, Mapped> mapped;
    for (const auto& [name, f] : files_in(path, {&set})) mapped[name] = {f->bytes(), f->size()};
    verify_checksums(path, mapped);
    sums.reset();
  }
  verify_rest(path, sums, {&set});
  read_weights(model, set, path, hf, sums, only);
}

void load_model_and_adapter(models::Model& model, const std::string& path, bool hf,
                            const std::string& adapter_path) {
  models::Model* base = model.frozen_base();
  load_model_weights(base ? *base : model, path, hf);
  if (base)
    base->store().release_masters();  // frozen under bf16: the projections as their copy only
  if (adapter_path.empty()) return;
  check(base != nullptr,
        "lora.adapter_path '" + adapter_path + "' given to a model without adapters");
  load_model_weights(model, adapter_path, true);
  log::info("LoRA: adapters from " + adapter_path);
}

}  // namespace titan::ckpt
