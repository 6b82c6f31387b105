#include "titan/checkpoint/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/core/log.h"

namespace titan::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

DType export_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  throw Error("checkpoint.export_dtype '" + name + "' must be float32, bfloat16 or float16");
}

// Tensors of the model under their titan FQNs (or HF keys), converted to dt; storage holds the
// converted bytes.
std::vector<WriteTensor> model_tensors(const models::Model& model, DType dt, bool hf_keys,
                                       std::vector<std::vector<uint8_t>>* storage) {
  std::vector<WriteTensor> out;
  auto add = [&](const std::string& key, const std::vector<int64_t>& shape, const float* src) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const void* data = src;
    if (dt != DType::F32) {
      storage->emplace_back(static_cast<size_t>(numel) * dtype_size(dt));
      f32_to(dt, src, numel, storage->back().data());
      data = storage->back().data();
    }
    out.push_back({key, dt, shape, data});
  };
  if (hf_keys) {
    for (const auto& t : model.hf_tensors()) add(t.key, t.shape, model.param_data() + t.offset);
    return out;
  }
  for (const auto& p : model.params())
    if (!p.alias) add(p.fqn, p.shape, model.param_data() + p.offset);
  for (const auto& b : model.buffers()) add(b.fqn, b.shape, b.data);  // MoE expert bias
  return out;
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  check(f.good(), "cannot write " + path.string());
}

json read_json(const fs::path& path) {
  std::ifstream f(path);
  check(f.good(), "cannot read " + path.string());
  json j = json::parse(f, nullptr, false);
  check(!j.is_discarded(), path.string() + ": invalid JSON");
  return j;
}

// Renames tmp to dst, replacing an older dst.
void commit_dir(const fs::path& tmp, const fs::path& dst) {
  std::error_code ec;
  if (fs::exists(dst)) {
    fs::path old = dst.string() + ".old-" + std::to_string(getpid());
    fs::rename(dst, old);
    fs::rename(tmp, dst);
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, dst);
  }
}

fs::path temp_sibling(const fs::path& dst) {
  fs::path tmp = dst.string() + ".tmp-" + std::to_string(getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  return tmp;
}

// step-N directories holding a full (resumable) checkpoint, sorted by N.
std::vector<std::pair<int64_t, fs::path>> resumable_steps(const fs::path& folder) {
  std::vector<std::pair<int64_t, fs::path>> r;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return r;
  for (const auto& e : fs::directory_iterator(folder)) {
    const std::string name = e.path().filename().string();
    const std::string digits = name.rfind("step-", 0) == 0 ? name.substr(5) : "";
    if (e.is_directory() && !digits.empty() && digits.size() < 18 &&
        digits.find_first_not_of("0123456789") == std::string::npos &&
        fs::exists(e.path() / "train_state.json") && fs::exists(e.path() / "optimizer.safetensors"))
      r.emplace_back(std::stoll(digits), e.path());
  }
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace

void load_model_weights(models::Model& model, const std::string& path, bool hf) {
  SafetensorsSet set = SafetensorsSet::open(path);
  if (hf) {
    model.load_hf(set, path);
    return;
  }
  std::vector<std::string> missing;
  for (const auto& p : model.params())
    if (!p.alias && !set.find(p.fqn)) missing.push_back(p.fqn);
  check(missing.empty(), path + ": native checkpoint lacks " + std::to_string(missing.size()) +
                             " parameter(s), e.g. '" + (missing.empty() ? "" : missing[0]) +
                             "'; for a Hugging Face directory set checkpoint.initial_load_in_hf");
  for (const auto& p : model.params())
    if (!p.alias) set.read_f32(p.fqn, p.shape, model.param_data() + p.offset);
  for (const auto& b : model.buffers())  // absent in a model-only export: stays zero
    if (set.find(b.fqn)) set.read_f32(b.fqn, b.shape, b.data);
}

void export_hf(const std::string& dir, const models::Model& model, const std::string& dtype,
               const std::string& source_dir, int64_t max_shard_bytes) {
  const DType dt = export_dtype(dtype);
  const fs::path dst(dir);
  fs::create_directories(dst.parent_path().empty() ? "." : dst.parent_path());
  const fs::path tmp = temp_sibling(dst);
  try {
    std::vector<std::vector<uint8_t>> storage;
    write_model(tmp.string(), model_tensors(model, dt, true, &storage), max_shard_bytes,
                {{"format", "pt"}});
    json base;
    if (!source_dir.empty() && fs::exists(fs::path(source_dir) / "config.json"))
      base = read_json(fs::path(source_dir) / "config.json");
    write_json(tmp / "config.json", model.hf_config(base, dtype));
    json gen = {{"_from_model_config", true}};
    if (!source_dir.empty() && fs::exists(fs::path(source_dir) / "generation_config.json")) {
      gen = read_json(fs::path(source_dir) / "generation_config.json");
    } else {
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (base.contains(k)) gen[k] = base[k];
    }
    write_json(tmp / "generation_config.json", gen);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"})
      if (!source_dir.empty() && fs::exists(fs::path(source_dir) / f))
        fs::copy_file(fs::path(source_dir) / f, tmp / f);
    commit_dir(tmp, dst);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

Checkpointer::Checkpointer(const config::JobConfig& cfg) : cfg_(cfg) {
  folder_ = (fs::path(cfg.dump_folder) / cfg.checkpoint.folder).string();
}

std::optional<TrainState> Checkpointer::load(models::Model& model, float* exp_avg,
                                             float* exp_avg_sq) {
  const auto& k = cfg_.checkpoint;
  auto steps = resumable_steps(folder_);
  if (k.enable && !steps.empty()) {
    fs::path dir = steps.back().second;
    if (k.load_step >= 0) {
      auto it = std::find_if(steps.begin(), steps.end(),
                             [&](const auto& s) { return s.first == k.load_step; });
      check(it != steps.end(), "checkpoint.load_step " + std::to_string(k.load_step) +
                                   " has no checkpoint in " + folder_);
      dir = it->second;
    }
    load_model_weights(model, dir.string(), false);
    SafetensorsSet opt = SafetensorsSet::open((dir / "optimizer.safetensors").string());
    for (const auto& p : model.params()) {
      if (p.alias) continue;
      opt.read_f32("exp_avg." + p.fqn, p.shape, exp_avg + p.offset);
      opt.read_f32("exp_avg_sq." + p.fqn, p.shape, exp_avg_sq + p.offset);
    }
    json j = read_json(dir / "train_state.json");
    TrainState st;
    st.step = j.at("step").get<int64_t>();
    st.tokens_seen = j.value("tokens_seen", int64_t{0});
    st.dataloader = j.value("dataloader", json());
    log::info("Resuming from checkpoint " + dir.string() + " at step " + std::to_string(st.step));
    return st;
  }
  if (!k.initial_load_path.empty()) {
    load_model_weights(model, k.initial_load_path, k.initial_load_in_hf);
    log::info("Loaded initial weights from " + k.initial_load_path);
  } else if (k.initial_load_in_hf) {
    load_model_weights(model, cfg_.model.hf_assets_path, true);
    log::info("Loaded Hugging Face weights from " + cfg_.model.hf_assets_path);
  }
  return std::nullopt;
}

void Checkpointer::maybe_save(const TrainState& st, bool last, const models::Model& model,
                              const float* exp_avg, const float* exp_avg_sq) {
  const auto& k = cfg_.checkpoint;
  if (!due(st.step, last)) return;
  const fs::path dst = fs::path(folder_) / ("step-" + std::to_string(st.step));
  fs::create_directories(folder_);
  if (last && k.last_save_model_only) {
    if (k.last_save_in_hf) {
      export_hf(dst.string(), model, k.export_dtype, cfg_.model.hf_assets_path);
    } else {
      const fs::path tmp = temp_sibling(dst);
      std::vector<std::vector<uint8_t>> storage;
      write_file((tmp / "model.safetensors").string(),
                 model_tensors(model, export_dtype(k.export_dtype), false, &storage));
      commit_dir(tmp, dst);
    }
    log::info("Saved the model (" + k.export_dtype + (k.last_save_in_hf ? ", Hugging Face" : "") +
              ") to " + dst.string());
    return;
  }
  const fs::path tmp = temp_sibling(dst);
  try {
    std::vector<std::vector<uint8_t>> storage;
    write_file((tmp / "model.safetensors").string(),
               model_tensors(model, DType::F32, false, &storage));
    std::vector<WriteTensor> opt;
    for (const auto& p : model.params()) {
      if (p.alias) continue;
      opt.push_back({"exp_avg." + p.fqn, DType::F32, p.shape, exp_avg + p.offset});
      opt.push_back({"exp_avg_sq." + p.fqn, DType::F32, p.shape, exp_avg_sq + p.offset});
    }
    write_file((tmp / "optimizer.safetensors").string(), opt);
    write_json(tmp / "train_state.json",
               {{"step", st.step}, {"tokens_seen", st.tokens_seen}, {"dataloader", st.dataloader}});
    commit_dir(tmp, dst);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  log::info("Saved checkpoint " + dst.string());
  purge();
}

void Checkpointer::purge() {
  const int64_t keep = cfg_.checkpoint.keep_latest_k;
  if (keep <= 0) return;
  auto steps = resumable_steps(folder_);
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    std::error_code ec;
    fs::remove_all(steps[i].second, ec);
  }
}

}  // namespace titan::ckpt
