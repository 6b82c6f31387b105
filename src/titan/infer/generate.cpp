#include "titan/infer/generate.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/checkpointer.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/data/chat_template.h"
#include "titan/data/tokenizer.h"
#include "titan/models/registry.h"

namespace titan::infer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t parse_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(flag + " expects an integer, got '" + v + "'");
}
double parse_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  throw Error(flag + " expects a number, got '" + v + "'");
}

// The directories a model came from: where generation_config.json and tokenizer.json may be.
std::vector<std::string> model_dirs(const config::JobConfig& c) {
  std::vector<std::string> d;
  if (!c.checkpoint.initial_load_path.empty()) d.push_back(c.checkpoint.initial_load_path);
  if (!c.model.hf_assets_path.empty()) d.push_back(c.model.hf_assets_path);
  return d;
}

// The EOS ids a completion stops at: generation_config.json's, else config.json's, else the
// tokenizer's; each must be in the vocabulary (an EOS the model cannot produce never stops it).
std::vector<int32_t> eos_ids(const config::JobConfig& c, const data::Tokenizer& tok,
                             const GenerationConfig& gen, const std::string& gen_path, int64_t V) {
  std::optional<std::vector<int64_t>> ids = gen.eos;
  std::string from = gen_path + ": field 'eos_token_id'";
  for (const auto& d : model_dirs(c))
    if (!ids)
      if ((ids = read_eos_token_id(d + "/config.json")))
        from = d + "/config.json: field 'eos_token_id'";
  if (!ids) {
    if (auto e = tok.eos_id()) ids = std::vector<int64_t>{*e};
    from = "the tokenizer's EOS token id";
  }
  std::vector<int32_t> r;
  for (int64_t id : ids.value_or(std::vector<int64_t>{})) {
    check(id >= 0 && id < V, from + " " + std::to_string(id) +
                                 " is outside the model's vocabulary of " + std::to_string(V) +
                                 " ids; fix it or pass --ignore_eos");
    r.push_back(static_cast<int32_t>(id));
  }
  return r;
}

std::shared_ptr<const data::Tokenizer> tokenizer_for(const config::JobConfig& c) {
  if (c.dataloader.tokenizer != "auto") return data::make_tokenizer(c.dataloader.tokenizer);
  for (const auto& d : model_dirs(c)) {
    std::error_code ec;
    if (fs::is_regular_file(d + "/tokenizer.json", ec)) return data::make_tokenizer(d);
  }
  throw Error("no tokenizer: " +
              (model_dirs(c).empty()
                   ? std::string("no model directory is set")
                   : "the model directory '" + model_dirs(c).front() + "' has no tokenizer.json") +
              "; pass --dataloader.tokenizer DIR (a directory with tokenizer.json) or byte");
}

struct Prompt {
  std::vector<int32_t> ids;
};

std::vector<Prompt> read_prompts(const GenerateOptions& o, const data::Tokenizer& tok) {
  auto format = [&](std::vector<data::ChatMessage> m) {
    if (!o.system.empty() && m.front().role != "system")
      m.insert(m.begin(), data::ChatMessage{"system", o.system, std::nullopt});
    return data::qwen3_chat_format(m, true, o.enable_thinking);
  };
  auto encode = [&](const std::string& text, bool chat) {
    Prompt p;
    tok.encode(chat ? format({{"user", text, std::nullopt}}) : text, false, false, &p.ids);
    return p;
  };
  std::vector<Prompt> r;
  if (!o.prompts_file.empty()) {
    io::check_input_file(o.prompts_file, "--prompts_file");
    std::ifstream f(o.prompts_file);
    check(f.good(), "--prompts_file '" + o.prompts_file + "' cannot be read");
    std::string line;
    int64_t n = 0;
    while (std::getline(f, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string at = o.prompts_file + ":" + std::to_string(n);
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        throw Error(at + ": not valid JSON (" + e.what() + ")");
      }
      check(j.is_object(),
            at + ": a record must be an object with \"text\", \"ids\" or \"messages\"");
      if (j.contains("ids")) {
        Prompt p;
        check(j["ids"].is_array(), at + ": \"ids\" must be an array of token ids");
        for (const auto& x : j["ids"]) {
          check(x.is_number_integer(), at + ": \"ids\" must be an array of token ids");
          p.ids.push_back(x.get<int32_t>());
        }
        r.push_back(std::move(p));
      } else if (j.contains("messages")) {
        Prompt p;
        tok.encode(format(data::chat_messages(j["messages"], at)), false, false, &p.ids);
        r.push_back(std::move(p));
      } else {
        check(j.contains("text") && j["text"].is_string(),
              at + ": a record needs \"text\" (a string), \"ids\" or \"messages\"");
        r.push_back(encode(j["text"].get<std::string>(), o.chat));
      }
    }
    check(!r.empty(), "--prompts_file '" + o.prompts_file + "' holds no prompts");
  } else {
    r.push_back(encode(o.prompt, o.chat));
  }
  for (size_t i = 0; i < r.size(); ++i)
    check(!r[i].ids.empty(),
          "prompt " + std::to_string(i) + " is empty (no tokens); give some text or ids");
  return r;
}

}  // namespace

GenerateOptions take_generate_flags(std::vector<std::string>& args) {
  GenerateOptions o;
  bool have_prompt = false;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    bool has_value = false;
    if (const auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto val = [&]() -> std::string {
      if (has_value) return value;
      check(i + 1 < args.size(), name + " needs a value");
      return args[++i];
    };
    if (name == "--prompt") {
      o.prompt = val();
      have_prompt = true;
    } else if (name == "--prompts_file") {
      o.prompts_file = val();
    } else if (name == "--output") {
      o.output = val();
    } else if (name == "--system") {
      o.system = val();
    } else if (name == "--max_new_tokens") {
      o.max_new_tokens = parse_int(name, val());
      check(o.max_new_tokens >= 1, "--max_new_tokens must be at least 1");
    } else if (name == "--temperature") {
      o.temperature = parse_double(name, val());
      check(*o.temperature >= 0, "--temperature must be >= 0 (0 is greedy)");
    } else if (name == "--top_k") {
      o.top_k = parse_int(name, val());
      check(*o.top_k >= 0, "--top_k must be >= 0 (0 is off)");
    } else if (name == "--top_p") {
      o.top_p = parse_double(name, val());
      check(*o.top_p > 0 && *o.top_p <= 1, "--top_p must be in (0, 1]");
    } else if (name == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(name, val()));
    } else if (name == "--chat" || name == "--greedy" || name == "--ignore_eos" ||
               name == "--enable_thinking") {
      check(!has_value, name + " takes no value");
      (name == "--chat"         ? o.chat
       : name == "--greedy"     ? o.greedy
       : name == "--ignore_eos" ? o.ignore_eos
                                : o.enable_thinking) = true;
    } else {
      rest.push_back(args[i]);
    }
  }
  check(have_prompt != !o.prompts_file.empty(),
        "titan generate needs exactly one of --prompt TEXT or --prompts_file F.jsonl");
  check(o.system.empty() || o.chat || !o.prompts_file.empty(), "--system needs --chat");
  check(!o.enable_thinking || o.chat || !o.prompts_file.empty(),
        "--enable_thinking needs --chat (it picks the chat template's thinking mode; a plain "
        "--prompt is not a conversation)");
  args = std::move(rest);
  return o;
}

void validate_generate_config(const config::JobConfig& cfg) {
  config::JobConfig c = cfg;
  c.training.seq_len = 1;
  c.training.local_batch_size = 1;
  models::validate_model_config(c);
}

// One function on purpose: it reads as the generation loop does (model and weights, tokenizer,
// prompts, the prefill and decode steps, the stop rules, the output), each step a few lines; split,
// the steps would pass a dozen locals between them.
GenerateResult generate(const config::JobConfig& cfg_in, const GenerateOptions& o) {
  check(!cfg_in.checkpoint.initial_load_path.empty() || !cfg_in.model.hf_assets_path.empty(),
        "titan generate needs weights: set model.hf_assets_path (a Hugging Face directory) or "
        "checkpoint.initial_load_path");
  if (!o.output.empty() && !o.prompts_file.empty())
    io::check_not_input(o.output, "--output", o.prompts_file, "--prompts_file");
  auto tok = tokenizer_for(cfg_in);
  const std::vector<Prompt> prompts = read_prompts(o, *tok);
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, std::ssize(p.ids));
  const int64_t context = longest + o.max_new_tokens;

  // The model, for one row of `context` tokens; every block checkpointed keeps only its input,
  // so the activations of a long prompt stay small.
  config::JobConfig cfg = cfg_in;
  cfg.training.local_batch_size = 1;
  cfg.training.seq_len = context;
  cfg.model.attn_mask_type = "causal";
  cfg.activation_checkpoint.mode = "full";
  try {
    models::validate_model_config(cfg);
  } catch (const Error& e) {
    throw Error("the longest prompt (" + std::to_string(longest) + " tokens) + --max_new_tokens " +
                std::to_string(o.max_new_tokens) + " = " + std::to_string(context) +
                " tokens does not fit the model: " + e.what());
  }
  models::BuildOptions bo;
  bo.batch = 1;
  bo.seq_len = context;
  bo.loss_chunks = 1;
  bo.init = false;
  bo.ac = models::AcPolicy::from_config("full", "");
  bo.device = cfg.training.device;  // the model, its key/value cache and logits there
  std::unique_ptr<models::Model> m = models::build_model(cfg, bo);
  const bool hf = cfg.checkpoint.initial_load_path.empty() || cfg.checkpoint.initial_load_in_hf;
  const std::string weights = cfg.checkpoint.initial_load_path.empty()
                                  ? cfg.model.hf_assets_path
                                  : cfg.checkpoint.initial_load_path;
  ckpt::load_model_and_adapter(*m, weights, hf, cfg.lora.adapter_path);
  log::info("Weights: loaded from " + io::absolute_path(weights) +
            (hf ? " (Hugging Face)" : " (titan checkpoint)"));
  // NaN or infinite weights would only give arbitrary tokens.
  const std::string bad = models::describe_nonfinite_weights(*m);
  check(bad.empty(), "the weights from " + io::absolute_path(weights) + " hold " + bad +
                         "; check them (nothing was generated)");
  const int64_t V = m->vocab_size();
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int32_t id : prompts[i].ids)
      check(id >= 0 && id < V, "prompt " + std::to_string(i) + ": token id " + std::to_string(id) +
                                   " outside the model's vocabulary of " + std::to_string(V));

  // Sampling: flags, else generation_config.json's, else greedy (transformers' defaults).
  std::string gen_path;  // the first model directory's generation_config.json, if any
  for (const auto& d : model_dirs(cfg)) {
    std::error_code ec;
    if (gen_path.empty() && fs::is_regular_file(d + "/generation_config.json", ec))
      gen_path = d + "/generation_config.json";
  }
  const GenerationConfig g =
      gen_path.empty() ? GenerationConfig{} : read_generation_config(gen_path);
  Sampling s;
  const bool flags = o.temperature || o.top_k || o.top_p;
  s.greedy = o.greedy || !(flags || g.do_sample);
  s.temperature = o.temperature ? *o.temperature : g.temperature.value_or(1.0);
  s.top_k = o.top_k ? *o.top_k : g.top_k.value_or(0);
  s.top_p = o.top_p ? *o.top_p : g.top_p.value_or(1.0);
  if (s.temperature == 0) s.greedy = true;
  s.seed = o.seed ? *o.seed : static_cast<uint64_t>(std::max<int64_t>(cfg.debug.seed, 0));
  const std::vector<int32_t> eos =
      o.ignore_eos ? std::vector<int32_t>{} : eos_ids(cfg, *tok, g, gen_path, V);
  char how[160];
  if (s.greedy)
    std::snprintf(how, sizeof how, "greedy");
  else
    std::snprintf(how, sizeof how, "sampling (temperature %g, top_k %lld, top_p %g, seed %llu)",
                  s.temperature, static_cast<long long>(s.top_k), s.top_p,
                  static_cast<unsigned long long>(s.seed));
  std::string eos_list;
  for (int32_t x : eos) eos_list += (eos_list.empty() ? "" : ",") + std::to_string(x);
  log::info("generate: " + std::to_string(prompts.size()) + " prompt(s), " + how + ", up to " +
            std::to_string(o.max_new_tokens) + " new tokens, EOS ids " +
            (eos_list.empty() ? "none" : eos_list) + ", weights in " +
            cfg.training.mixed_precision_param);
  const auto P = static_cast<int64_t>(prompts.size());
  models::Generator& kv = m->generation();
  auto cache = kv.new_kv_cache(P, context);
  GenerateResult res;
  res.completions.resize(static_cast<size_t>(P));
  std::vector<float> logits(static_cast<size_t>(P * V));
  std::vector<int32_t> next(static_cast<size_t>(P));
  const bool stream = !o.quiet && P == 1;
  size_t printed = 0;
  auto emit = [&](Completion& c) {  // streams the new complete characters of prompt 0
    if (!stream) return;
    const std::string t = tok->decode(c.ids);
    if (t.size() >= 3 && t.compare(t.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;  // partial
    if (t.size() > printed) std::fwrite(t.data() + printed, 1, t.size() - printed, stdout);
    std::fflush(stdout);
    printed = std::max(printed, t.size());
  };
  {  // first use, untimed: the bf16 weight copy, the kernels' set-up
    auto warm = kv.new_kv_cache(1, 1);
    const int32_t seq0 = 0;
    kv.forward_cached(*warm, prompts[0].ids.data(), &seq0, 1, logits.data());
  }
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  int64_t prefill_tokens = 0;
  const int64_t per_call = kv.max_new_per_call();
  for (int64_t p = 0; p < P; ++p) {
    const auto& ids = prompts[static_cast<size_t>(p)].ids;
    res.completions[static_cast<size_t>(p)].prompt_ids = ids;
    for (int64_t at = 0; at < std::ssize(ids); at += per_call) {
      const int64_t n = std::min<int64_t>(per_call, std::ssize(ids) - at);
      std::vector<int32_t> seq(static_cast<size_t>(n), static_cast<int32_t>(p));
      kv.forward_cached(*cache, ids.data() + at, seq.data(), n, logits.data() + p * V);
    }
    prefill_tokens += std::ssize(ids);
  }
  const double prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  int64_t decode_tokens = 0;
  std::vector<int32_t> active(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) active[static_cast<size_t>(p)] = static_cast<int32_t>(p);
  for (int64_t step = 0; !active.empty(); ++step) {
    std::vector<int32_t> still, toks;
    for (size_t r = 0; r < active.size(); ++r) {
      const int32_t p = active[r];
      Completion& c = res.completions[static_cast<size_t>(p)];
      const int32_t t = next_token(logits.data() + static_cast<int64_t>(r) * V, V, s,
                                   static_cast<uint64_t>(p), static_cast<uint64_t>(step));
      c.ids.push_back(t);
      emit(c);
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) {
        c.finish = "eos";
      } else if (std::ssize(c.ids) >= o.max_new_tokens) {
        c.finish = "length";
      } else {
        still.push_back(p);
        toks.push_back(t);
      }
    }
    active = std::move(still);
    if (active.empty()) break;
    kv.forward_cached(*cache, toks.data(), active.data(), std::ssize(active), logits.data());
    decode_tokens += std::ssize(active);
  }
  const double decode_s = std::chrono::duration<double>(clock::now() - t0).count();
  if (stream) {
    std::printf("\n");
    std::fflush(stdout);
  }
  for (auto& c : res.completions) c.text = tok->decode(c.ids);
  res.prefill_tokens_per_s = prefill_s > 0 ? static_cast<double>(prefill_tokens) / prefill_s : 0;
  res.decode_tokens_per_s = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0;
  if (!o.output.empty()) {
    std::ostringstream out;
    for (size_t i = 0; i < res.completions.size(); ++i) {
      const Completion& c = res.completions[i];
      out << json{{"index", i},
                  {"prompt_ids", c.prompt_ids},
                  {"ids", c.ids},
                  {"text", c.text},
                  {"finish_reason", c.finish}}
                 .dump(-1, ' ', false, json::error_handler_t::replace)
          << "\n";
    }
    io::write_file_atomic(o.output, out.str());
  }
  return res;
}

}  // namespace titan::infer
