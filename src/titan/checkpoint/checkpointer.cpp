// The Checkpointer (checkpointer.h): which step to load, native and sharded saves, the purge of
// older steps and the cleanup of killed runs; the formats live in step_dir, native,
// sharded_index and hf_export.
#include "titan/checkpoint/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/hf_export.h"
#include "titan/checkpoint/native.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/checkpoint/sharded_index.h"
#include "titan/checkpoint/step_dir.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/core/test_hooks.h"

namespace titan::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace detail;

namespace {
std::string moment_name(bool first, const std::string& fqn) {
  return (first ? "exp_avg." : "exp_avg_sq.") + fqn;
}

// Reads `count` elements of a moment through `read` (into fp32) and stores them at element `at`
// of m (first) or v in the moments' dtype (bf16: rounded to nearest, exact for values saved in
// bf16).
template <typename Read>
void read_moment(const Moments& mo, bool first, int64_t at, int64_t count, const Read& read) {
  if (mo.codec) {
    std::vector<float> tmp(static_cast<size_t>(count));
    read(tmp.data());
    mo.codec->encode(first, at, count, tmp.data());
    return;
  }
  if (mo.dtype == DType::F32) {
    read(static_cast<float*>(mo.at(first, at)));
    return;
  }
  std::vector<float> tmp(static_cast<size_t>(count));
  read(tmp.data());
  f32_to(mo.dtype, tmp.data(), count, mo.at(first, at));
}
}  // namespace

WriteTensor Moments::tensor(std::string name, bool first, std::vector<int64_t> shape,
                            int64_t at) const {
  if (!codec) return {std::move(name), dtype, std::move(shape), this->at(first, at)};
  MomentCodec* c = codec;
  return {std::move(name), DType::F32, std::move(shape), nullptr,
          [c, first, at](int64_t i, int64_t n, void* dst) {
            c->decode(first, at + i, n, static_cast<float*>(dst));
          }};
}

void check_dump_folder(const config::JobConfig& cfg) {
  check(!cfg.dump_folder.empty(),
        "dump_folder is empty: metrics.jsonl would go to the file-system root and checkpoints to "
        "the current directory; give a directory, e.g. --dump_folder ./outputs");
}

Checkpointer::Checkpointer(const config::JobConfig& cfg) : cfg_(cfg) {
  check_dump_folder(cfg);
  folder_ = (fs::path(cfg.dump_folder) / cfg.checkpoint.folder).string();
}

void Checkpointer::clean_stale() {
  std::error_code ec;
  if (!fs::is_directory(folder_, ec)) return;
  std::vector<std::string> removed, restored;
  for (const auto& e : fs::directory_iterator(folder_, ec)) {
    std::string base, kind;
    int64_t pid = 0;
    const std::string name = e.path().filename().string();
    if (!io::parse_temp_name(name, &base, &kind, &pid) || parse_step(base) < 0 ||
        io::owner_alive(pid, e.path().string()))
      continue;
    const fs::path step_dir = fs::path(folder_) / base;
    std::error_code rec;
    if (kind == "old" && !fs::exists(step_dir, rec)) {
      rename_or_throw(e.path(), step_dir);  // killed between the two renames of a replacement
      restored.push_back(name);
      continue;
    }
    fs::remove_all(e.path(), rec);
    check(!rec, "cannot remove " + e.path().string() + ", left by a killed run (" + rec.message() +
                    "); remove it by hand");
    removed.push_back(name);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string r;
    for (const auto& n : v) r += (r.empty() ? "" : ", ") + n;
    return r;
  };
  if (!removed.empty())
    log::info("Removed " + std::to_string(removed.size()) + " unfinished folder(s) left in " +
              folder_ + " by a killed run: " + join(removed));
  if (!restored.empty())
    log::info("Restored " + join(restored) + " in " + folder_ +
              " (a run was killed while replacing it)");
}

std::optional<TrainState> Checkpointer::load(models::Model& model, const Moments& moments,
                                             const Segments& opt, const UnitDone& unit_done) {
  const auto& k = cfg_.checkpoint;
  const int64_t steps = cfg_.training.steps;
  const Segments* slices = unit_done ? &opt : nullptr;
  const bool held = std::any_of(model.params().begin(), model.params().end(),
                                [](const models::ParamInfo& p) { return p.split_dim >= 0; });
  if (k.enable) clean_stale();
  const std::vector<StepDir> dirs = k.enable ? step_dirs(folder_) : std::vector<StepDir>{};
  if (!dirs.empty()) {
    const StepDir* pick = &dirs.back();
    if (k.load_step >= 0) {
      auto it = std::find_if(dirs.begin(), dirs.end(),
                             [&](const StepDir& d) { return d.step == k.load_step; });
      if (it == dirs.end()) {
        std::string have;
        for (const auto& d : dirs) have += (have.empty() ? "" : ", ") + std::to_string(d.step);
        throw Error("checkpoint.load_step " + std::to_string(k.load_step) +
                    " has no checkpoint in " + folder_ + " (steps there: " + have + ")");
      }
      pick = &*it;
    }
    const std::string dir = pick->path.string();
    check(pick->step <= steps,
          dir + " is at step " + std::to_string(pick->step) +
              ", past training.steps = " + std::to_string(steps) +
              ": raise --training.steps, resume an earlier step with --checkpoint.load_step, "
              "or use another dump_folder");
    if (pick->kind == Kind::Incomplete)
      throw Error(dir + " lacks " + pick->lacks + " (an incomplete or damaged checkpoint)" +
                  older_hint(dirs, pick->step));
    if (pick->kind == Kind::ModelOnly) {
      if (pick->step == steps) {
        TrainState st;
        st.step = pick->step;
        st.finished = true;
        st.path = dir;
        log::info(dir + " holds the model exported at the end of training");
        return st;
      }
      const std::string why = dir +
                              " holds only the model exported at the end of a run "
                              "(checkpoint.last_save_model_only), which cannot resume "
                              "training";
      auto full = std::find_if(dirs.rbegin(), dirs.rend(),
                               [&](const StepDir& d) { return d.kind == Kind::Full; });
      check(k.load_step < 0 && full != dirs.rend() && full->step < pick->step,
            why + "; to train on from its weights, use --checkpoint.initial_load_path " + dir +
                " with another dump_folder");
      log::warn(why + "; resuming from " + full->path.string() +
                ", the newest full checkpoint, instead");
      pick = &*full;
    }
    try {
      return load_full(model, moments, opt, unit_done, pick->path.string(), pick->step);
    } catch (const Error& e) {
      if (k.load_step >= 0) throw;
      throw Error(std::string(e.what()) + older_hint(dirs, pick->step));
    }
  }
  if (!k.initial_load_path.empty()) {
    load_model_weights(model, k.initial_load_path, k.initial_load_in_hf, true, slices);
    log::info("Loaded initial weights from " + k.initial_load_path +
              ((slices && k.initial_load_in_hf) || held ? " (this rank's slices)" : ""));
  } else if (k.initial_load_in_hf) {
    load_model_weights(model, cfg_.model.hf_assets_path, true, true, slices);
    log::info("Loaded Hugging Face weights from " + io::absolute_path(cfg_.model.hf_assets_path) +
              (slices || held ? " (this rank's slices)" : ""));
  }
  return std::nullopt;
}

TrainState Checkpointer::load_full(models::Model& model, const Moments& moments,
                                   const Segments& segs, const UnitDone& unit_done,
                                   const std::string& dir, int64_t step) {
  const int64_t n = model.num_params();
  const Segments opt = segs.empty() ? Segments{{0, n}} : segs;
  const auto sums = precheck_dir(dir);
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kShardedIndexName, ec)) {
    const ShardedDir sharded(dir, sums);
    TrainState st = read_train_state(dir, step);
    sharded.read_weights(model, unit_done);
    // The moments' slices that overlap this rank's range.
    for (const Slice& sl : slices_in(model, opt))
      for (const bool first : {true, false})
        read_moment(moments, first, sl.at, sl.end - sl.begin, [&](float* dst) {
          sharded.read_held(moment_name(first, sl.p->fqn), *sl.p, sl.begin, sl.end, dst);
        });
    log::info("Resuming from sharded checkpoint " + dir + " at step " + std::to_string(st.step));
    return st;
  }
  SafetensorsSet weights = SafetensorsSet::open(dir);
  SafetensorsSet opt_set = SafetensorsSet::open((fs::path(dir) / "optimizer.safetensors").string());
  verify_rest(dir, sums, {&weights, &opt_set});  // train_state.json
  TrainState st = read_train_state(dir, step);
  const bool whole = opt.size() == 1 && opt[0].begin == 0 && opt[0].len == n &&
                     std::none_of(model.params().begin(), model.params().end(),
                                  [](const models::ParamInfo& p) { return p.split_dim >= 0; });
  if (!whole || unit_done) {
    // A shard of the state: every file checked first (one hashing pass over the mappings), then
    // the weights copied unit by unit and only this rank's slices of the moments.
    read_weights_held(model, weights, dir, sums, unit_done, {&weights, &opt_set});
    for (const Slice& sl : slices_in(model, opt))
      for (const bool first : {true, false}) {
        const std::string name = moment_name(first, sl.p->fqn);
        const TensorView* t = opt_set.find(name);
        check(t != nullptr && (t->dtype == DType::F32 || t->dtype == DType::BF16) &&
                  t->shape == sl.p->shape,
              opt_set.path() + ": tensor '" + name +
                  "' must be F32 or BF16 of the parameter's shape");
        read_moment(moments, first, sl.at, sl.end - sl.begin,
                    [&](float* dst) { read_held(opt_set, name, *sl.p, sl.begin, sl.end, dst); });
      }
    log::info("Resuming from checkpoint " + dir + " at step " + std::to_string(st.step));
    return st;
  }
  read_weights(model, weights, dir, false, sums, nullptr);
  if (moments.dtype == DType::F32 && !moments.codec) {
    std::vector<Want> wants;
    for (const auto& p : model.params()) {
      if (p.alias) continue;
      for (const bool first : {true, false})
        wants.push_back(
            {moment_name(first, p.fqn), p.shape, static_cast<float*>(moments.at(first, p.offset))});
    }
    read_native(opt_set, wants, sums);
  } else {  // tensor by tensor through fp32 (the files were verified above)
    for (const auto& p : model.params()) {
      if (p.alias) continue;
      for (const bool first : {true, false})
        read_moment(moments, first, p.offset, p.numel, [&](float* dst) {
          opt_set.read_f32_range(moment_name(first, p.fqn), p.shape, 0, p.numel, dst);
        });
    }
  }
  log::info("Resuming from checkpoint " + dir + " at step " + std::to_string(st.step));
  return st;
}

void Checkpointer::maybe_save(const TrainState& st, bool last, const models::Model& model,
                              const Moments& moments) {
  const auto& k = cfg_.checkpoint;
  if (!due(st.step, last)) return;
  const fs::path dst = fs::path(folder_) / step_name(st.step);
  std::error_code ec;
  fs::create_directories(folder_, ec);
  check(!ec, "cannot create the checkpoint folder " + folder_ + " (" + ec.message() + ")");
  if (last && k.last_save_model_only) {
    if (k.last_save_in_hf && cfg_.lora.merge_on_export && models::frozen_weights(model) > 0) {
      // LoRA merged into the base weights for the export, which then get their own bits back.
      auto& m = const_cast<models::Model&>(model);
      m.merge_adapters(true);
      try {
        export_hf(dst.string(), *m.frozen_base(), k.export_dtype, cfg_.model.hf_assets_path);
      } catch (...) {
        m.merge_adapters(false);
        throw;
      }
      m.merge_adapters(false);
    } else if (k.last_save_in_hf) {
      export_hf(dst.string(), model, k.export_dtype, cfg_.model.hf_assets_path);
    } else {
      const fs::path tmp = temp_sibling(dst);
      try {
        write_file((tmp / "model.safetensors").string(),
                   model_tensors(model, export_dtype(k.export_dtype), false));
        test::kill_point("export:model");
        write_checksums(tmp.string());
        io::fsync_dir(tmp.string());
        commit_dir(tmp, dst);
      } catch (const Error& e) {
        fs::remove_all(tmp, ec);
        throw Error("cannot export the model to " + dst.string() +
                    " (nothing was left there): " + e.what());
      }
    }
    // A LoRA model's Hugging Face save without merging is its PEFT adapter alone.
    const bool adapter = k.last_save_in_hf && !cfg_.lora.merge_on_export &&
                         model.hf().hf_weights_file() != "model.safetensors";
    log::info(std::string(adapter ? "Saved the LoRA adapter (" : "Saved the model (") +
              k.export_dtype +
              (adapter             ? ", PEFT"
               : k.last_save_in_hf ? ", Hugging Face"
                                   : "") +
              ") to " + dst.string());
    return;
  }
  const fs::path tmp = temp_sibling(dst);
  try {
    write_file((tmp / "model.safetensors").string(), model_tensors(model, DType::F32, false));
    test::kill_point("save:model");
    std::vector<WriteTensor> opt;
    for (const auto& p : model.params()) {
      if (p.alias) continue;
      for (const bool first : {true, false})
        opt.push_back(moments.tensor(moment_name(first, p.fqn), first, p.shape, p.offset));
    }
    write_file((tmp / "optimizer.safetensors").string(), opt);
    test::kill_point("save:optimizer");
    write_train_state(tmp, st);
    test::kill_point("save:train_state");
    write_checksums(tmp.string());
    test::kill_point("save:checksums");
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const Error& e) {
    fs::remove_all(tmp, ec);
    throw Error("cannot save checkpoint " + dst.string() +
                " (the partial copy was removed; earlier checkpoints are intact): " + e.what());
  }
  log::info("Saved checkpoint " + dst.string());
  purge();
}

std::string Checkpointer::sharded_begin(int64_t step) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  check(!ec, "cannot create the checkpoint folder " + folder_ + " (" + ec.message() + ")");
  return temp_sibling(fs::path(folder_) / step_name(step)).string();
}

json Checkpointer::write_shard(const std::string& tmp, int64_t writer, int64_t writers,
                               const Segments& segs, const models::Model& model,
                               const float* params, const Moments& moments,
                               bool with_replicated) const {
  const std::string name = shard_file_name(writer, writers);
  const std::string path = (fs::path(tmp) / name).string();
  std::vector<WriteTensor> tensors;
  json slices = json::object();
  for (const Slice& sl : slices_in(model, segs)) {
    if (!with_replicated && sl.p->split_dim < 0) continue;
    const std::vector<int64_t> shape{sl.end - sl.begin};
    tensors.push_back(params ? WriteTensor{sl.p->fqn, DType::F32, shape, params + sl.at}
                             : weight_tensor(model.store(), sl.p->fqn, shape,
                                             sl.p->offset + sl.begin, DType::F32));
    for (const bool first : {true, false})
      tensors.push_back(moments.tensor(moment_name(first, sl.p->fqn), first, shape, sl.at));
    json entries = json::array();
    run_groups(*sl.p, sl.begin, sl.end,
               [&](const RunGroup& g) { entries.push_back(g.to_json(name)); });
    for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."})
      for (const auto& e : entries) slices[prefix + sl.p->fqn].push_back(e);
  }
  if (writer == 0)
    for (const auto& b : model.buffers()) {
      tensors.push_back({b.fqn, DType::F32, {numel_of(b.shape)}, b.data});
      slices[b.fqn].push_back(json::array({name, 0, numel_of(b.shape)}));
    }
  write_file(path, tensors, {{"titan_shard", std::to_string(writer)}});
  test::kill_point("save:shard");
  return {{"sums", {{name, file_checksum_entry(path)}}}, {"slices", slices}};
}

void Checkpointer::sharded_commit(const std::string& tmp_dir, const TrainState& st,
                                  const models::Model& model, const json& written) {
  const fs::path tmp(tmp_dir), dst = fs::path(folder_) / step_name(st.step);
  const int64_t shards = static_cast<int64_t>(written.size());
  try {
    json tensors = json::object(), sums = json::object();
    for (const auto& p : model.params())
      if (!p.alias)
        for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."})
          tensors[prefix + p.fqn] = {{"shape", p.shape}, {"slices", json::array()}};
    for (const auto& b : model.buffers())
      tensors[b.fqn] = {{"shape", b.shape}, {"slices", json::array()}};
    bool strided = false;
    for (const auto& w : written) {
      sums.update(w.at("sums"));
      for (const auto& [name, entries] : w.at("slices").items())
        for (const auto& e : entries) {
          strided = strided || e.size() > 3;
          tensors.at(name)["slices"].push_back(e);
        }
    }
    write_json(tmp / kShardedIndexName, {{"format", "titan-sharded-checkpoint"},
                                         {"version", strided ? 2 : 1},
                                         {"shards", shards},
                                         {"tensors", tensors}});
    write_train_state(tmp, st);
    test::kill_point("save:train_state");
    write_checksums(tmp.string(), sums);
    test::kill_point("save:checksums");
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error("cannot save checkpoint " + dst.string() +
                " (the partial copy was removed; earlier checkpoints are intact): " + e.what());
  }
  log::info("Saved sharded checkpoint " + dst.string() + " (" + std::to_string(shards) +
            " shards written in parallel)");
  purge();
}

void Checkpointer::hf_parts_commit(const std::string& tmp_dir, int64_t step,
                                   const models::Model& model, const json& parts) {
  const auto& k = cfg_.checkpoint;
  const fs::path tmp(tmp_dir), dst = fs::path(folder_) / step_name(step);
  try {
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    json sums = json::object();
    int64_t total = 0;
    for (const auto& p : parts) {
      total += p.at("total_size").get<int64_t>();
      index["weight_map"].update(p.at("weight_map"));
      sums.update(p.at("sums"));
    }
    index["metadata"]["total_size"] = total;
    write_json(tmp / "model.safetensors.index.json", index);
    write_hf_extras(tmp, model, k.export_dtype, cfg_.model.hf_assets_path);
    write_checksums(tmp.string(), sums);
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const Error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error("cannot export the model to " + dst.string() +
                " (nothing was left there): " + e.what());
  }
  log::info("Saved the model (" + k.export_dtype + ", Hugging Face) to " + dst.string() + " (" +
            std::to_string(parts.size()) + " files written in parallel)");
}

void Checkpointer::purge() {
  const int64_t keep = cfg_.checkpoint.keep_latest_k;
  if (keep <= 0) return;
  std::vector<StepDir> full;
  for (auto& d : step_dirs(folder_))
    if (d.kind == Kind::Full) full.push_back(d);
  for (size_t i = 0; i + static_cast<size_t>(keep) < full.size(); ++i) {
    // Renamed first, so a run killed while removing leaves a .del folder, not a half step-N.
    const fs::path del = full[i].path.string() + ".del-" + std::to_string(getpid());
    std::error_code ec;
    fs::rename(full[i].path, del, ec);
    if (ec) continue;
    test::kill_point("save:purge");
    fs::remove_all(del, ec);
  }
}

}  // namespace titan::ckpt
