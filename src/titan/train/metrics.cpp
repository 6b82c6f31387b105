#include "titan/train/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/log.h"

namespace titan::train {

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string format_console(const StepMetrics& m, bool color) {
  const char* red = color ? "\033[31m" : "";
  const char* green = color ? "\033[32m" : "";
  const char* orange = color ? "\033[33m" : "";
  const char* turquoise = color ? "\033[36m" : "";
  const char* blue = color ? "\033[34m" : "";
  const char* cyan = color ? "\033[96m" : "";
  const char* magenta = color ? "\033[35m" : "";
  const char* reset = color ? "\033[39m" : "";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%sstep: %2lld  %sloss: %8.5f  %sgrad_norm: %7.4f  %smemory: %5.2fGiB(%.2f%%)  "
                "%stps: %s  %stflops: %.2f  %smfu: %.2f%%%s",
                red, static_cast<long long>(m.step), green, m.loss, orange, m.grad_norm, turquoise,
                m.memory_gib, m.memory_pct, blue, with_commas(std::llround(m.tps)).c_str(), cyan,
                m.tflops, magenta, m.mfu, reset);
  return buf;
}

std::string format_jsonl(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"memory_gib", m.memory_gib},
                      {"memory_pct", m.memory_pct},
                      {"tps", m.tps},
                      {"tflops", m.tflops},
                      {"mfu", m.mfu},
                      {"step_time_s", m.step_time},
                      {"data_loading_time_s", m.data_loading_time},
                      {"n_tokens_seen", m.n_tokens_seen}};
  if (std::isfinite(m.aux_loss)) j["aux_loss"] = m.aux_loss;
  if (!m.expert_load.empty()) {
    j["expert_load"] = nlohmann::json::array();
    for (const auto& e : m.expert_load)
      j["expert_load"].push_back({{"layer", e.layer}, {"min", e.min}, {"max", e.max}});
  }
  return j.dump();
}

std::string format_validation_console(const ValidationMetrics& m, bool color) {
  const char* yellow = color ? "\033[33m" : "";
  const char* green = color ? "\033[32m" : "";
  const char* turquoise = color ? "\033[36m" : "";
  const char* blue = color ? "\033[34m" : "";
  const char* reset = color ? "\033[39m" : "";
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "%svalidate step: %2lld  %sloss: %7.4f  %smemory: %5.2fGiB(%.2f%%)  %stps: %s%s",
                yellow, static_cast<long long>(m.step), green, m.loss, turquoise, m.memory_gib,
                m.memory_pct, blue, with_commas(std::llround(m.tps)).c_str(), reset);
  return buf;
}

std::string format_validation_jsonl(const ValidationMetrics& m) {
  nlohmann::json j = {
      {"step", m.step},          {"validation_loss", m.loss},  {"validation_tokens", m.tokens},
      {"validation_tps", m.tps}, {"memory_gib", m.memory_gib}, {"memory_pct", m.memory_pct}};
  return j.dump();
}

MetricsWriter::MetricsWriter(const std::string& jsonl_path, bool color) : color_(color) {
  if (jsonl_path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(jsonl_path).parent_path(), ec);
  jsonl_.open(jsonl_path, std::ios::app);
  check(jsonl_.good(),
        "cannot open metrics file '" + jsonl_path + "' for writing; check dump_folder");
}

void MetricsWriter::log(const StepMetrics& m) {
  log::info(format_console(m, color_));
  if (jsonl_.is_open()) {
    jsonl_ << format_jsonl(m) << '\n';
    jsonl_.flush();
  }
}

void MetricsWriter::log_validation(const ValidationMetrics& m) {
  log::info(format_validation_console(m, color_));
  if (jsonl_.is_open()) {
    jsonl_ << format_validation_jsonl(m) << '\n';
    jsonl_.flush();
  }
}

}  // namespace titan::train
