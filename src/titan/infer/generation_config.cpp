// generation_config.json and the EOS ids of config.json (infer/generate.h): read and checked
// field by field. Kept apart from generation so that its readers link without the model.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/infer/generate.h"

namespace titan::infer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<json> read_json(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  io::check_input_file(path, "JSON file");
  std::ifstream f(path);
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
}

// An "eos_token_id" field (an integer or a list of them, as Transformers writes it) of a
// generation_config.json or config.json; nullopt when absent or null.
std::optional<std::vector<int64_t>> eos_field(const json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null())
    return std::nullopt;
  const json& e = j["eos_token_id"];
  std::vector<int64_t> r;
  for (const auto& x : e.is_array() ? e : json::array({e})) {
    if (!x.is_number_integer())
      throw Error(path + ": field 'eos_token_id' must be a token id or a list of them, got " +
                  x.dump());
    r.push_back(x.get<int64_t>());
  }
  return r;
}

}  // namespace

GenerationConfig read_generation_config(const std::string& path) {
  const std::optional<json> j = read_json(path);
  check(j.has_value(), "cannot read " + path);
  check(j->is_object(), path + ": not a JSON object");
  const json& g = *j;
  GenerationConfig s;
  auto bad = [&](const char* k, const std::string& what) {
    return Error(path + ": field '" + k + "' " + what + ", got " + g.at(k).dump());
  };
  auto num = [&](const char* k) -> std::optional<double> {
    if (!g.contains(k) || g[k].is_null()) return std::nullopt;
    if (!g[k].is_number()) throw bad(k, "must be a number");
    return g[k].get<double>();
  };
  s.temperature = num("temperature");
  if (s.temperature && *s.temperature < 0) throw bad("temperature", "must not be negative");
  s.top_p = num("top_p");
  if (s.top_p && !(*s.top_p > 0 && *s.top_p <= 1)) throw bad("top_p", "must be in (0, 1]");
  if (auto k = num("top_k")) {
    if (*k < 0 || *k != std::floor(*k) || *k > 1e15)
      throw bad("top_k", "must be a whole number >= 0");
    s.top_k = static_cast<int64_t>(*k);
  }
  if (g.contains("do_sample") && !g["do_sample"].is_null()) {
    if (!g["do_sample"].is_boolean()) throw bad("do_sample", "must be true or false");
    s.do_sample = g["do_sample"].get<bool>();
  }
  s.eos = eos_field(g, path);
  return s;
}

std::optional<std::vector<int64_t>> read_eos_token_id(const std::string& path) {
  const std::optional<json> j = read_json(path);
  return j ? eos_field(*j, path) : std::nullopt;
}

}  // namespace titan::infer
