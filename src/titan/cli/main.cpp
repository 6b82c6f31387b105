// titan: the command line.
//   titan train --config NAME [--section.field value | --section.field=value | --bool.flag] ...
//   titan tokenize --tokenizer DIR (--text TEXT | --input PATH --output F.bin) [options]
//   titan config show --config NAME [flags]
//   titan config list
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "titan/config/builtin_configs.h"
#include "titan/config/job_config.h"
#include "titan/core/buffer.h"
#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/data/token_shard.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/communicator.h"
#include "titan/infer/generate.h"
#include "titan/models/registry.h"
#include "titan/ops/device.h"
#include "titan/plugin/registry.h"
#include "titan/tools/check_kernel.h"
#include "titan/tools/memory_plan.h"
#include "titan/tools/plot.h"
#include "titan/train/evaluate.h"
#include "titan/train/trainer.h"

namespace {

const char* kUsage =
    "usage: titan train --config NAME [--section.field value ...]\n"
    "       titan eval --config NAME [--model.hf_assets_path DIR | --checkpoint.initial_load_path "
    "P]\n"
    "                  [--eval.tokens_path F.safetensors [--eval.logits_out OUT.safetensors]]\n"
    "       titan generate --config NAME [--model.hf_assets_path DIR | "
    "--checkpoint.initial_load_path P]\n"
    "                  (--prompt TEXT | --prompts_file F.jsonl) [--chat [--system TEXT] "
    "[--enable_thinking]]\n"
    "                  [--max_new_tokens N] [--greedy | --temperature T --top_k K --top_p P "
    "--seed S]\n"
    "                  [--ignore_eos] [--output F.jsonl]\n"
    "       titan plot DUMP_FOLDER [--output F.svg] [--title TEXT]   (loss, lr against step)\n"
    "       titan plan --config NAME [flags]   (the memory the run needs, nothing allocated)\n"
    "       titan check-kernel --config NAME [--override.imports LIB[,LIB]] [--training.device D]\n"
    "                  [flags]   (overriding kernels, or a device's, against the built-in CPU "
    "ones)\n"
    "       titan tokenize --tokenizer DIR|byte --text TEXT [--bos_eos]\n"
    "       titan tokenize --tokenizer DIR|byte --input PATH --output F.bin [--dataset auto|text|\n"
    "                      jsonl|fortunes] [--text_field text] [--skip_malformed]\n"
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

// An example command line for `cmd`, for the "--config is required" message.
std::string example(const std::string& cmd) {
  if (cmd == "eval") return "titan eval --config qwen3_debugmodel --model.hf_assets_path DIR";
  if (cmd == "generate")
    return "titan generate --config qwen3_debugmodel --model.hf_assets_path DIR --prompt TEXT";
  if (cmd == "check-kernel")
    return "titan check-kernel --config qwen3_debugmodel --override.imports LIB";
  if (cmd == "config show") return "titan config show --config qwen3_debugmodel";
  return "titan train --config qwen3_debugmodel";
}

// Removes "--config NAME" / "--config=NAME" from args and returns NAME; `cmd` names the command
// for the messages.
std::string take_config_name(std::vector<std::string>& args, const std::string& cmd) {
  std::string name;
  bool found = false;
  for (size_t i = 0; i < args.size();) {
    std::string value;
    if (args[i] == "--config") {
      titan::check(i + 1 < args.size(), "--config needs a name; 'titan config list' shows them");
      value = args[i + 1];
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
    } else if (args[i].rfind("--config=", 0) == 0) {
      value = args[i].substr(9);
      args.erase(args.begin() + static_cast<long>(i));
    } else {
      ++i;
      continue;
    }
    titan::check(!found, "--config given twice ('" + name + "' and '" + value +
                             "'); pass one config and change fields with --section.field flags");
    found = true;
    name = value;
  }
  titan::check(!name.empty(), "--config is required, for example: " + example(cmd));
  return name;
}

// check_model false: the model section is not checked against the model (config show prints a
// config whose model directory is missing, and says so).
titan::config::JobConfig build_config(std::vector<std::string> args, const std::string& cmd,
                                      bool check_model = true) {
  load_modules(args);
  std::string name = take_config_name(args, cmd);
  return titan::config::build_job_config(
      name, args, check_model ? titan::models::validate_model_config : nullptr);
}

std::string resolved_model(const titan::config::JobConfig& cfg) {
  return titan::models::model_spec(cfg.model.name).describe(cfg);
}

// titan tokenize: the ids of --text, or --input documents to a pre-tokenized shard.
int tokenize(const std::vector<std::string>& args) {
  std::string tokenizer = "byte", text, input, output;
  bool has_text = false, bos_eos = false;
  titan::data::SourceOptions src;
  src.dataset = "auto";
  src.skip_malformed_hint = "pass --skip_malformed";
  src.text_field_hint = "set --text_field";
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    bool has_value = false;
    if (auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "--bos_eos" || name == "--skip_malformed") {
      titan::check(!has_value, name + " takes no value");
      (name == "--bos_eos" ? bos_eos : src.skip_malformed) = true;
      continue;
    }
    const bool known = name == "--tokenizer" || name == "--text" || name == "--input" ||
                       name == "--output" || name == "--dataset" || name == "--text_field";
    titan::check(known, "titan tokenize: unknown option '" + name +
                            "'; options: --tokenizer --text --bos_eos --input --output --dataset "
                            "--text_field --skip_malformed");
    if (!has_value) {
      titan::check(i + 1 < args.size(), "titan tokenize: " + name + " needs a value");
      value = args[++i];
    }
    if (name == "--tokenizer") {
      tokenizer = value;
    } else if (name == "--text") {
      text = value;
      has_text = true;
    } else if (name == "--input") {
      input = value;
    } else if (name == "--output") {
      output = value;
    } else if (name == "--dataset") {
      src.dataset = value;
    } else {
      src.text_field = value;
    }
  }
  titan::check(has_text != !input.empty(),
               "titan tokenize needs exactly one of --text TEXT and --input PATH");
  titan::check(!src.dataset.empty() && src.dataset != "tokens",
               "titan tokenize --dataset must be auto, text, jsonl or fortunes");
  titan::check(!src.text_field.empty(), "titan tokenize --text_field must name a JSON field");
  if (has_text) {
    titan::check(output.empty(), "titan tokenize --text prints the ids; --output needs --input");
    auto tok = titan::data::make_tokenizer(tokenizer);
    std::vector<int32_t> ids;
    tok->encode(text, bos_eos, bos_eos, &ids);
    std::string line;
    for (int32_t id : ids) {
      if (!line.empty()) line += ' ';
      line += std::to_string(id);
    }
    std::printf("%s\n", line.c_str());
    return 0;
  }
  titan::check(!output.empty(), "titan tokenize --input needs --output FILE.bin");
  titan::check(!bos_eos,
               "titan tokenize --bos_eos applies to --text (shards always hold BOS/EOS "
               "as the loader adds them)");
  // The output must not be one of the inputs: the file itself, or a file of the input folder.
  titan::io::check_not_input(output, "titan tokenize --output", input, "--input");
  const std::filesystem::path folder = std::filesystem::path(output).parent_path();
  titan::check(!std::filesystem::is_directory(input) || !std::filesystem::exists(output) ||
                   !titan::io::same_file(folder.empty() ? "." : folder.string(), input),
               "titan tokenize --output " + output + " is a file of the --input folder " + input +
                   ", read as a document: writing it would destroy it; give another --output");
  src.path = input;
  auto tok = titan::data::make_tokenizer(tokenizer);
  titan::data::TokenizeStats st = titan::data::tokenize_to_shard(src, *tok, output);
  const std::string problems = titan::data::describe_problems(st.source, src.text_field);
  if (!problems.empty()) titan::log::warn("tokenize: " + problems);
  titan::log::info("tokenize: wrote " + std::to_string(st.documents) + " documents, " +
                   std::to_string(st.tokens) + " tokens from " + std::to_string(st.source.files) +
                   " file(s) to " + output + " (tokenizer " + tok->name() + ")");
  return 0;
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
    titan::config::JobConfig cfg = build_config(args, cmd);
    if (cfg.debug.print_config)
      std::printf("%s%s", titan::config::to_string(cfg).c_str(), resolved_model(cfg).c_str());
    // One run per dump folder (rank 0 holds it for all): a second would interleave its metrics
    // and checkpoints with this one's.
    titan::io::DirLock lock;
    if (titan::dist::world().rank() == 0 && !cfg.dump_folder.empty())
      lock = titan::io::DirLock(cfg.dump_folder, "dump_folder");
    titan::train::Trainer trainer(cfg);
    trainer.train();
    return 0;
  }
  if (cmd == "eval") {
    titan::config::JobConfig cfg = build_config(args, cmd);
    titan::train::EvalResult r = titan::train::evaluate(cfg);
    std::printf("eval: loss %.6f  perplexity %.4f  tokens %lld\n", r.loss, r.perplexity,
                static_cast<long long>(r.tokens));
    return 0;
  }
  if (cmd == "generate") {
    const titan::infer::GenerateOptions o = titan::infer::take_generate_flags(args);
    load_modules(args);
    const std::string name = take_config_name(args, cmd);
    titan::config::JobConfig cfg =
        titan::config::build_job_config(name, args, titan::infer::validate_generate_config);
    const titan::infer::GenerateResult r = titan::infer::generate(cfg, o);
    if (r.completions.size() > 1 && o.output.empty())
      for (size_t i = 0; i < r.completions.size(); ++i)
        std::printf("[%zu] %s\n", i, r.completions[i].text.c_str());
    std::fprintf(stderr, "generate: prefill %.1f tokens/s, decode %.1f tokens/s\n",
                 r.prefill_tokens_per_s, r.decode_tokens_per_s);
    return 0;
  }
  if (cmd == "plot") {
    titan::check(
        !args.empty() && args[0].rfind("--", 0) != 0,
        "titan plot needs a run's dump_folder: titan plot DIR [--output F.svg] [--title TEXT]");
    const std::string dir = args[0];
    std::string out = dir + "/loss.svg", title = "titan: " + dir;
    for (size_t i = 1; i < args.size(); ++i) {
      if ((args[i] == "--output" || args[i] == "--title") && i + 1 < args.size())
        (args[i] == "--output" ? out : title) = args[i + 1], ++i;
      else
        throw titan::Error("titan plot: unknown argument '" + args[i] +
                           "'; usage: titan plot DIR [--output F.svg] [--title TEXT]");
    }
    titan::tools::plot_metrics(dir + "/metrics.jsonl", out, title);
    std::printf("wrote %s\n", out.c_str());
    return 0;
  }
  if (cmd == "tokenize") return tokenize(args);
  if (cmd == "plan") {
    titan::config::JobConfig cfg = build_config(args, cmd);
    const titan::tools::MemoryPlan plan = titan::tools::plan_memory(cfg);
    std::printf("%s", plan.format().c_str());
    std::fflush(stdout);
    // against the machine's memory, or the device's where it can be queried: titan train's
    // refusal, as the error line
    titan::tools::check_fits(plan);
    return 0;
  }
  if (cmd == "check-kernel") {
    titan::config::JobConfig cfg = build_config(args, cmd);
    return titan::tools::check_kernels(cfg) ? 0 : 1;
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
    titan::config::JobConfig cfg = build_config(args, "config show", false);
    // A config whose model folder is not there yet (a seed config before the download) is shown
    // all the same; anything else wrong with the model section is an error, as for train.
    const std::string& assets = cfg.model.hf_assets_path;
    std::string model;
    if (!assets.empty() && !std::filesystem::exists(assets)) {
      model = "# model.hf_assets_path '" + assets +
              "' does not exist: the model is the config function's above; once the folder is "
              "there its config.json sets the architecture (download it there, or pass "
              "--model.hf_assets_path DIR)\n";
    } else {
      titan::models::validate_model_config(cfg);
      model = resolved_model(cfg);
    }
    std::printf("# config %s\n%s%s", "resolved", titan::config::to_string(cfg).c_str(),
                model.c_str());
    return 0;
  }
  throw titan::Error(
      "unknown command '" + cmd +
      "'; commands: train, eval, generate, plot, plan, tokenize, check-kernel, config");
}

}  // namespace

namespace {

// A crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE) says whose code it was in: a plugin's (named: the
// plugin is at fault) or titan's. Only write(2) and dladdr (plugin_at) run here; then the
// signal's default action ends the process as before. Not installed under AddressSanitizer,
// whose own report is more useful.
#ifndef __SANITIZE_ADDRESS__
void write_all(const char* const* parts) {
  for (; *parts; ++parts) {
    size_t n = 0;
    while ((*parts)[n]) ++n;
    if (::write(STDERR_FILENO, *parts, n) < 0) return;
  }
}

void on_crash(int sig, siginfo_t*, void* context) {
  const void* pc = nullptr;
#if defined(__x86_64__)
  pc = reinterpret_cast<const void*>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  pc = reinterpret_cast<const void*>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#else
  (void)context;
#endif
  const char* name = sig == SIGSEGV  ? "SIGSEGV"
                     : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGILL ? "SIGILL"
                                     : "SIGFPE";
  if (const char* plugin = titan::plugin::plugin_at(pc)) {
    const char* parts[] = {"titan: error: plugin '",
                           plugin,
                           "' crashed (",
                           name,
                           ") in its own code: the plugin is at fault, not titan; fix it or "
                           "leave it out of --override.imports / --module\n",
                           nullptr};
    write_all(parts);
  } else {
    const char* parts[] = {"titan: internal error: ", name,
                           " (a crash in titan or a library it uses); please report it with the "
                           "command line\n",
                           nullptr};
    write_all(parts);
  }
  std::raise(sig);  // SA_RESETHAND: delivered with the default action once this returns
}
#endif

void install_crash_handler() {
#ifndef __SANITIZE_ADDRESS__
  struct sigaction sa = {};
  sa.sa_sigaction = on_crash;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &sa, nullptr);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every rank runs this; an error on any rank ends the whole job (abort_job), so no
  // rank is left waiting in a collective. Without mpirun MPI is never initialized.
  int world = 1;
  std::string who;  // " (rank R of N)" in multi-rank runs
  auto fail = [&](const char* kind, const char* what, int code) {
    std::fprintf(stderr, "titan: %s%s: %s\n", kind, who.c_str(), what);
    std::fflush(stderr);
    if (world > 1) titan::dist::abort_job(code);
    return code;
  };
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, which the writers report naming
  // the file, instead of killing the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  install_crash_handler();
  try {
    titan::dist::Communicator& w = titan::dist::world();
    world = w.size();
    if (world > 1)
      who = " (rank " + std::to_string(w.rank()) + " of " + std::to_string(world) + ")";
    titan::log::set_rank(w.rank(), world);
    const int code = run(std::vector<std::string>(argv + 1, argv + argc));
    // What was printed must have arrived (a full disk or /dev/full behind stdout).
    const bool flushed = std::fflush(stdout) == 0 && !std::ferror(stdout);
    titan::check(flushed,
                 "cannot write to standard output (" + titan::io::errno_message(errno) + ")");
    return code;
  } catch (const titan::Error& e) {
    return fail("error", e.what(), 1);
  } catch (const std::bad_alloc& e) {
    const auto* oom = dynamic_cast<const titan::OutOfMemory*>(&e);
    const auto gib = [](double bytes) {
      char b[32];
      std::snprintf(b, sizeof b, "%.3f GiB", bytes / (1024.0 * 1024 * 1024));
      return std::string(b);
    };
    const int64_t planned = titan::planned_bytes();
    const std::string msg =
        "out of memory: " +
        (oom ? "an allocation of " + gib(static_cast<double>(oom->bytes())) + " failed"
             : std::string("an allocation failed")) +
        (planned > 0 ? " (the memory plan counted " + gib(static_cast<double>(planned)) +
                           " for the whole run)"
                     : std::string()) +
        "; a memory limit (ulimit -v) or other processes leave less than the machine "
        "has; 'titan plan' with the same flags shows each part";
    return fail("error", msg.c_str(), 1);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), 3);
  } catch (...) {
    return fail("internal error", "an exception that is not a std::exception", 3);
  }
}
