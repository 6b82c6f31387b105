// The Hugging Face export: export_hf (one process), HfPart (one file of a parallel export by the
// ranks of a sharded run), and the export dtype and extra files they share.
#include "titan/checkpoint/hf_export.h"

#include <cstdio>
#include <system_error>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/native.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/checkpoint/sharded_index.h"
#include "titan/checkpoint/step_dir.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/test_hooks.h"

namespace titan::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace detail;

namespace detail {

DType export_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  throw Error("checkpoint.export_dtype '" + name + "' must be float32, bfloat16 or float16");
}

void write_hf_extras(const fs::path& tmp, const models::Model& model, const std::string& dtype,
                     const std::string& source_dir) {
  json base;
  if (!source_dir.empty() && fs::exists(fs::path(source_dir) / "config.json"))
    base = read_json(fs::path(source_dir) / "config.json");
  write_json(tmp / model.hf().hf_config_file(), model.hf().hf_config(base, dtype));
  test::kill_point("export:config");
  json gen = {{"_from_model_config", true}};
  if (!source_dir.empty() && fs::exists(fs::path(source_dir) / "generation_config.json")) {
    gen = read_json(fs::path(source_dir) / "generation_config.json");
  } else {
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (base.contains(k)) gen[k] = base[k];
  }
  write_json(tmp / "generation_config.json", gen);
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"})
    if (!source_dir.empty() && fs::exists(fs::path(source_dir) / f)) {
      fs::copy_file(fs::path(source_dir) / f, tmp / f, ec);
      check(!ec, "cannot copy " + (fs::path(source_dir) / f).string() + " to " +
                     (tmp / f).string() + " (" + ec.message() + ")");
    }
}

}  // namespace detail

void HfPart::add_unit(const models::Model& model, int64_t unit, const std::string& dtype) {
  const DType dt = export_dtype(dtype);
  for (const auto& t : model.hf().hf_tensors()) {
    if (model.param(t.fqn).group != unit) continue;
    const int64_t n = numel_of(t.shape);
    storage_.emplace_back(static_cast<size_t>(n) * dtype_size(dt));
    f32_to(dt, model.store().param_data() + t.offset, n, storage_.back().data());
    tensors_.push_back({t.key, dt, t.shape, storage_.back().data()});
  }
}

json HfPart::write(const std::string& tmp, int64_t part, int64_t parts) const {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors",
                static_cast<long long>(part + 1), static_cast<long long>(parts));
  const std::string path = (fs::path(tmp) / name).string();
  write_file(path, tensors_, {{"format", "pt"}});
  json map = json::object();
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    map[tensors_[i].name] = name;
    bytes += static_cast<int64_t>(storage_[i].size());
  }
  return {
      {"weight_map", map}, {"total_size", bytes}, {"sums", {{name, file_checksum_entry(path)}}}};
}

void export_hf(const std::string& dir, const models::Model& model, const std::string& dtype,
               const std::string& source_dir, int64_t max_shard_bytes) {
  const DType dt = export_dtype(dtype);
  const fs::path dst(dir);
  std::error_code ec;
  fs::create_directories(dst.parent_path().empty() ? "." : dst.parent_path(), ec);
  check(!ec, "cannot create " + dst.parent_path().string() + " (" + ec.message() + ")");
  const fs::path tmp = temp_sibling(dst);
  try {
    if (model.hf().hf_weights_file() == "model.safetensors")
      write_model(tmp.string(), model_tensors(model, dt, true), max_shard_bytes,
                  {{"format", "pt"}});
    else  // adapters (PEFT's adapter_model.safetensors): small, one file
      write_file((tmp / model.hf().hf_weights_file()).string(), model_tensors(model, dt, true),
                 {{"format", "pt"}});
    test::kill_point("export:model");
    write_hf_extras(tmp, model, dtype, source_dir);
    write_checksums(tmp.string());
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const Error& e) {
    fs::remove_all(tmp, ec);
    throw Error("cannot export the model to " + dir + " (nothing was left there): " + e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace titan::ckpt
