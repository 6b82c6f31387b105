// Step directories of a checkpoint folder: step-N names, the crash-safe commit, listing and
// classifying, train_state.json and the JSON file helpers.
#include "titan/checkpoint/step_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <system_error>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/test_hooks.h"

namespace titan::ckpt::detail {
namespace fs = std::filesystem;
using nlohmann::json;

void write_json(const fs::path& path, const json& j) {
  io::write_file_atomic(path.string(), j.dump(2) + "\n");
}

json read_json(const fs::path& path) {
  io::check_input_file(path.string(), "JSON file");
  std::ifstream f(path);
  check(f.good(), "cannot read " + path.string());
  json j = json::parse(f, nullptr, false);
  check(!j.is_discarded(), path.string() + ": invalid JSON");
  return j;
}

std::string step_name(int64_t step) { return "step-" + std::to_string(step); }

int64_t parse_step(const std::string& name) {
  const std::string digits = name.rfind("step-", 0) == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.size() >= 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  check(!ec, "cannot rename " + from.string() + " to " + to.string() + " (" + ec.message() + ")");
}

void commit_dir(const fs::path& tmp, const fs::path& dst) {
  const std::string parent = dst.parent_path().string();
  std::error_code ec;
  if (!fs::exists(dst, ec)) {
    rename_or_throw(tmp, dst);
    io::fsync_dir(parent);
    return;
  }
  if (!test::disabled("rename_exchange") &&
      ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) == 0) {
    io::fsync_dir(parent);
    test::kill_point("save:replace");
    fs::remove_all(tmp, ec);  // the previous copy
    return;
  }
  const int e = errno;
  check(test::disabled("rename_exchange") || e == EINVAL || e == ENOSYS || e == EOPNOTSUPP,
        "cannot replace " + dst.string() + " with " + tmp.string() + " (" + io::errno_message(e) +
            ")");
  // No RENAME_EXCHANGE here: two renames; a crash between them leaves step-N.old-PID, which
  // the next run renames back (clean_stale).
  const fs::path old = dst.string() + ".old-" + std::to_string(getpid());
  io::rename_aside(dst.string(), old.string());
  test::kill_point("save:replace");
  try {
    rename_or_throw(tmp, dst);
  } catch (const Error&) {
    fs::rename(old, dst, ec);  // put the previous copy back
    throw;
  }
  io::fsync_dir(parent);
  fs::remove_all(old, ec);
}

fs::path temp_sibling(const fs::path& dst) {
  fs::path tmp = io::temp_name(dst.string());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  check(!ec, "cannot create " + tmp.string() + " (" + ec.message() + ")");
  return tmp;
}

namespace {

StepDir classify(int64_t step, const fs::path& dir) {
  std::error_code ec;
  const bool state = fs::exists(dir / "train_state.json", ec);
  if (fs::exists(dir / kShardedIndexName, ec))
    return {step, dir, state ? Kind::Full : Kind::Incomplete, state ? "" : "train_state.json"};
  const bool opt = fs::exists(dir / "optimizer.safetensors", ec);
  const bool model = fs::exists(dir / "model.safetensors", ec) ||
                     fs::exists(dir / "model.safetensors.index.json", ec);
  if (state && opt && model) return {step, dir, Kind::Full, ""};
  if (!state && !opt && model) return {step, dir, Kind::ModelOnly, ""};
  const char* lacks = !model ? "model.safetensors"
                      : !opt ? "optimizer.safetensors"
                             : "train_state.json";
  return {step, dir, Kind::Incomplete, lacks};
}

}  // namespace

std::vector<StepDir> step_dirs(const fs::path& folder) {
  std::vector<StepDir> r;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return r;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const int64_t step = parse_step(e.path().filename().string());
    if (step < 0) continue;
    std::error_code dec;
    // A step-N that is not a folder would be skipped silently and the run would start over.
    check(e.is_directory(dec), e.path().string() +
                                   " is not a folder, but its name is a checkpoint step's; move "
                                   "it out of " +
                                   folder.string());
    r.push_back(classify(step, e.path()));
  }
  std::sort(r.begin(), r.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return r;
}

std::string older_hint(const std::vector<StepDir>& dirs, int64_t step) {
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (it->step < step && it->kind == Kind::Full)
      return "; step " + std::to_string(it->step) + " is the newest older complete checkpoint: " +
             "resume it with --checkpoint.load_step " + std::to_string(it->step);
  return "; no older complete checkpoint exists";
}

namespace {

// A non-negative integer field of train_state.json.
int64_t state_int(const json& j, const std::string& path, const char* key, bool required) {
  if (!j.contains(key)) {
    check(!required, path + ": missing \"" + key + "\"");
    return 0;
  }
  const json& v = j[key];
  check(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0) &&
            v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
        path + ": \"" + key + "\" must be a non-negative integer, got " + v.dump());
  return v.get<int64_t>();
}

}  // namespace

TrainState read_train_state(const fs::path& dir, int64_t step) {
  const fs::path p = dir / "train_state.json";
  const std::string path = p.string();
  const json j = read_json(p);
  check(j.is_object(), path + ": not a JSON object");
  TrainState st;
  st.path = path;
  st.step = state_int(j, path, "step", true);
  check(st.step == step, path + ": \"step\" is " + std::to_string(st.step) + " but the folder is " +
                             step_name(step));
  st.tokens_seen = state_int(j, path, "tokens_seen", false);
  for (const char* key : {"dataloader", "data"}) {
    const json v = j.value(key, json());
    check(v.is_null() || v.is_object(),
          path + ": \"" + key + "\" must be a JSON object, got " + v.dump().substr(0, 60));
    (std::string(key) == "dataloader" ? st.dataloader : st.data) = v;
  }
  if (j.contains("optimizer_state_dtype")) {
    const json& d = j["optimizer_state_dtype"];
    check(d.is_string() && (d == "float32" || d == "bfloat16" || d == "int8"),
          path + ": \"optimizer_state_dtype\" is " + d.dump().substr(0, 60) +
              ", not a dtype this titan reads (float32, bfloat16, int8); resume it with the titan "
              "that wrote it, or start from its weights alone (--checkpoint.initial_load_path with "
              "--checkpoint.initial_load_model_only)");
    st.optimizer_state_dtype = d.get<std::string>();
  }
  return st;
}

void write_train_state(const fs::path& dir, const TrainState& st) {
  json j = {{"step", st.step},
            {"tokens_seen", st.tokens_seen},
            {"dataloader", st.dataloader},
            {"data", st.data}};
  if (!st.optimizer_state_dtype.empty() && st.optimizer_state_dtype != "float32")
    j["optimizer_state_dtype"] = st.optimizer_state_dtype;
  write_json(dir / "train_state.json", j);
}

}  // namespace titan::ckpt::detail
