// titan: the command line.
//   titan train --config NAME [--section.field value | --section.field=value | --bool.flag] ...
//   titan config show --config NAME [flags]
//   titan config list
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "titan/config/builtin_configs.h"
#include "titan/config/job_config.h"
#include "titan/core/error.h"
#include "titan/plugin/registry.h"
#include "titan/train/check_kernel.h"
#include "titan/train/evaluate.h"
#include "titan/train/trainer.h"

namespace {

const char* kUsage =
    "usage: titan train --config NAME [--section.field value ...]\n"
    "       titan eval --config NAME [--model.hf_assets_path DIR | --checkpoint.initial_load_path "
    "P]\n"
    "                  [--eval.tokens_path F.safetensors [--eval.logits_out OUT.safetensors]]\n"
    "       titan check-kernel --config NAME --override.imports LIB[,LIB] [flags]\n"
    "       titan config show --config NAME [--section.field value ...]\n"
    "       (any command: --module LIB loads a plugin first)\n"
    "       titan config list\n";

// Loads every "--module LIB" / "--module=LIB" (plugins registering config functions, types, ops
// and overrides) and removes them from args.
void load_modules(std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size();) {
    std::string lib;
    if (args[i] == "--module") {
      titan::check(i + 1 < args.size(), "--module needs a plugin library path or name");
      lib = args[i + 1];
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
    } else if (args[i].rfind("--module=", 0) == 0) {
      lib = args[i].substr(9);
      args.erase(args.begin() + static_cast<long>(i));
    } else {
      ++i;
      continue;
    }
    titan::plugin::Registry::global().load(lib);
  }
}

// Removes "--config NAME" / "--config=NAME" from args and returns NAME.
std::string take_config_name(std::vector<std::string>& args) {
  std::string name;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config") {
      titan::check(i + 1 < args.size(), "--config needs a name; 'titan config list' shows them");
      name = args[i + 1];
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
      break;
    }
    if (args[i].rfind("--config=", 0) == 0) {
      name = args[i].substr(9);
      args.erase(args.begin() + static_cast<long>(i));
      break;
    }
  }
  titan::check(!name.empty(),
               "--config is required, for example: titan train --config qwen3_debugmodel");
  return name;
}

titan::config::JobConfig build_config(std::vector<std::string> args) {
  load_modules(args);
  std::string name = take_config_name(args);
  return titan::config::build_job_config(name, args);
}

std::string resolved_model(const titan::config::JobConfig& cfg) {
  titan::qwen3::Qwen3Args a = titan::config::resolve_model(cfg);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "\n# resolved model\n# vocab_size=%lld dim=%lld n_layers=%lld n_heads=%lld "
                "n_kv_heads=%lld head_dim=%lld hidden_dim=%lld rope_theta=%g max_seq_len=%lld "
                "tie_embeddings=%s attn_mask_type=%s\n",
                static_cast<long long>(a.vocab_size), static_cast<long long>(a.dim),
                static_cast<long long>(a.n_layers), static_cast<long long>(a.n_heads),
                static_cast<long long>(a.n_kv_heads), static_cast<long long>(a.head_dim),
                static_cast<long long>(a.hidden_dim), a.rope_theta,
                static_cast<long long>(a.max_seq_len), a.tie_embeddings ? "true" : "false",
                a.attn_mask_type.c_str());
  return buf;
}

int run(std::vector<std::string> args) {
  titan::config::register_builtin_configs();
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "train") {
    titan::config::JobConfig cfg = build_config(args);
    if (cfg.debug.print_config)
      std::printf("%s%s", titan::config::to_string(cfg).c_str(), resolved_model(cfg).c_str());
    titan::train::Trainer trainer(cfg);
    trainer.train();
    return 0;
  }
  if (cmd == "eval") {
    titan::config::JobConfig cfg = build_config(args);
    titan::train::EvalResult r = titan::train::evaluate(cfg);
    std::printf("eval: loss %.6f  perplexity %.4f  tokens %lld\n", r.loss, r.perplexity,
                static_cast<long long>(r.tokens));
    return 0;
  }
  if (cmd == "check-kernel") {
    titan::config::JobConfig cfg = build_config(args);
    return titan::train::check_kernels(cfg) ? 0 : 1;
  }
  if (cmd == "config") {
    titan::check(!args.empty(), "titan config needs 'show' or 'list'");
    const std::string sub = args[0];
    args.erase(args.begin());
    if (sub == "list") {
      load_modules(args);
      for (const auto& n : titan::config::config_names()) std::printf("%s\n", n.c_str());
      return 0;
    }
    titan::check(sub == "show", "unknown 'titan config " + sub + "'; use show or list");
    titan::config::JobConfig cfg = build_config(args);
    std::printf("# config %s\n%s%s", "resolved", titan::config::to_string(cfg).c_str(),
                resolved_model(cfg).c_str());
    return 0;
  }
  throw titan::Error("unknown command '" + cmd + "'; commands: train, eval, check-kernel, config");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const titan::Error& e) {
    std::fprintf(stderr, "titan: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "titan: internal error: %s\n", e.what());
    return 3;
  }
}
