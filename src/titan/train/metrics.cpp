#include "titan/train/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/log.h"
#include "titan/core/test_hooks.h"

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
  std::string line = buf;
  for (const auto& [name, v] : m.objective)
    if (name == "rewards/accuracies" || name == "rewards/margins") {
      std::snprintf(buf, sizeof buf, "  %s: %.4f", name.c_str(), v);
      line += buf;
    }
  return line;
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
  for (const auto& [name, v] : m.objective) j[name] = v;
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

int64_t trim_metrics(const std::string& path, int64_t start_step) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  io::remove_stale_temps(p.parent_path().string(), p.filename().string());
  if (!fs::exists(p, ec)) return 0;
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path + ": cannot read");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(!in.bad(), path + ": read failed");
  std::string kept;
  int64_t dropped = 0;
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) {  // cut short by a kill
      ++dropped;
      break;
    }
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= start_step) {
      kept += line;
      kept += '\n';
    } else {
      ++dropped;
    }
  }
  if (dropped == 0) return 0;
  io::write_file_atomic(path, kept, "metrics:rewrite");
  return dropped;
}

MetricsWriter::~MetricsWriter() = default;

MetricsWriter::MetricsWriter(const std::string& jsonl_path, bool color, int64_t start_step,
                             const std::string& tb_dir)
    : color_(color) {
  if (!tb_dir.empty()) {
    tb_ = std::make_unique<TensorBoardWriter>(tb_dir);
    log::info("TensorBoard: " + tb_->path());
  }
  if (jsonl_path.empty()) return;
  std::error_code ec;
  const auto parent = std::filesystem::path(jsonl_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  check(!ec, "cannot create " + parent.string() + " for " + jsonl_path + " (" + ec.message() +
                 "); check dump_folder");
  if (const int64_t n = trim_metrics(jsonl_path, start_step))
    log::info(jsonl_path + ": dropped " + std::to_string(n) + " record(s) after step " +
              std::to_string(start_step) + " left by an earlier run (this run " +
              (start_step > 0 ? "resumes" : "starts") + " there)");
  jsonl_ = io::AppendFile(jsonl_path);
}

void MetricsWriter::append(const std::string& line, int64_t step) {
  if (!jsonl_.is_open()) return;
  const std::string what = "the metrics record of step " + std::to_string(step);
  if (test::kill_due("metrics:partial")) {
    jsonl_.append(line.substr(0, line.size() / 2), what);
    test::kill_now();
  }
  jsonl_.append(line + "\n", what);
}

void MetricsWriter::log(const StepMetrics& m) {
  log::info(format_console(m, color_));
  append(format_jsonl(m), m.step);
  if (!tb_) return;
  std::vector<std::pair<std::string, double>> s = {
      {"loss_metrics/global_avg_loss", m.loss},
      {"grad_norm", m.grad_norm},
      {"lr/AdamW", m.lr},
      {"throughput(tps)", m.tps},
      {"tflops", m.tflops},
      {"mfu(%)", m.mfu},
      {"time_metrics/end_to_end(s)", m.step_time},
      {"time_metrics/data_loading(s)", m.data_loading_time},
      {"time_metrics/data_loading(%)",
       m.step_time > 0 ? 100.0 * m.data_loading_time / m.step_time : 0.0},
      {"memory/max_reserved(GiB)", m.memory_gib},
      {"memory/max_reserved(%)", m.memory_pct},
      {"n_tokens_seen", static_cast<double>(m.n_tokens_seen)}};
  if (std::isfinite(m.aux_loss)) s.push_back({"moe/aux_loss", m.aux_loss});
  s.insert(s.end(), m.objective.begin(), m.objective.end());
  for (const auto& e : m.expert_load) {
    s.push_back({"moe/layer_" + std::to_string(e.layer) + "/min_tokens", e.min});
    s.push_back({"moe/layer_" + std::to_string(e.layer) + "/max_tokens", e.max});
  }
  tb(s, m.step);
}

void MetricsWriter::log_validation(const ValidationMetrics& m) {
  log::info(format_validation_console(m, color_));
  append(format_validation_jsonl(m), m.step);
  if (tb_)
    tb({{"validation_metrics/loss", m.loss},
        {"validation_metrics/throughput(tps)", m.tps},
        {"validation_metrics/memory/max_reserved(GiB)", m.memory_gib}},
       m.step);
}

void MetricsWriter::tb(const std::vector<std::pair<std::string, double>>& scalars, int64_t step) {
  try {
    for (const auto& [tag, v] : scalars) tb_->scalar(tag, v, step);
  } catch (const Error& e) {
    log::warn(std::string(e.what()) + "; TensorBoard is off for the rest of this run");
    tb_.reset();
  }
}

}  // namespace titan::train
