// LoRA's configuration readers (models/lora.h): the target_modules list and a PEFT
// adapter_config.json, checked field by field. Kept apart from the adapters so that their fuzz
// target links without the model.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/models/lora.h"

namespace titan::models {

std::vector<std::string> lora_target_leaves(const std::string& list) {
  static const std::map<std::string, std::string> hf = {
      {"q_proj", "wq"},    {"k_proj", "wk"},  {"v_proj", "wv"},   {"o_proj", "wo"},
      {"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
  static const std::set<std::string> leaves = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(start, end - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    start = end + 1;
    check(!name.empty() || list.find_first_not_of(" \t,") == std::string::npos,
          "lora.target_modules '" + list +
              "' has an empty name (two commas, or one at an end); list the projections as "
              "wq,wv");
    if (name.empty()) continue;
    if (auto it = hf.find(name); it != hf.end()) name = it->second;
    check(leaves.count(name) == 1,
          "lora.target_modules: '" + name +
              "' is not a projection of a Qwen3 layer; use wq,wk,wv,wo,w1,w2,w3 or q_proj,k_proj,"
              "v_proj,o_proj,gate_proj,up_proj,down_proj");
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  check(!out.empty(), "lora.target_modules is empty; name at least one projection (e.g. wq,wv)");
  return out;
}

void read_adapter_config(const std::string& file, LoraOptions* o) {
  io::check_input_file(file, "lora.adapter_path:");
  std::ifstream in(file);
  check(in.good(), "lora.adapter_path: cannot read " + file +
                       " (point lora.adapter_path at a PEFT adapter directory)");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded(), file +
                               ": not valid JSON; lora.adapter_path must hold a PEFT "
                               "adapter_config.json");
  check(j.is_object(), file + ": not a PEFT adapter config (not a JSON object)");
  const auto bad = [&](const char* field, const std::string& what) {
    return Error(file + ": field '" + field + "' " + what +
                 (j.contains(field) ? ", got " + j[field].dump() : std::string()));
  };
  if (!j.contains("peft_type") || j["peft_type"] != "LORA")
    throw bad("peft_type", "must be \"LORA\" (titan reads LoRA adapters only)");
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() <= 0)
    throw bad("r", "must be a positive integer");
  o->rank = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number() ||
      !(j["lora_alpha"].get<double>() > 0) || !std::isfinite(j["lora_alpha"].get<double>()))
    throw bad("lora_alpha", "must be a positive number");
  o->alpha = j["lora_alpha"].get<double>();
  for (const char* flag : {"use_rslora", "use_dora"})
    if (j.contains(flag) && !j[flag].is_null() && !j[flag].is_boolean())
      throw bad(flag, "must be true or false");
  o->use_rslora = j.contains("use_rslora") && j["use_rslora"] == true;
  if (j.contains("use_dora") && j["use_dora"] == true)
    throw bad("use_dora", "is true: DoRA adapters are not supported");
  const nlohmann::json* t = j.contains("target_modules") ? &j["target_modules"] : nullptr;
  std::string list;
  if (t && t->is_string()) {
    list = t->get<std::string>();
  } else if (t && t->is_array()) {
    for (const auto& m : *t) {
      if (!m.is_string()) throw bad("target_modules", "must be a string or a list of strings");
      if (!list.empty()) list += ',';
      list += m.get<std::string>();
    }
  } else {
    throw bad("target_modules", "must be a string or a list of strings");
  }
  o->target_modules = list;
}

}  // namespace titan::models
