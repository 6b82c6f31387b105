// Step directories of a checkpoint folder (checkpointer.h): their step-N names, the crash-safe
// commit of a finished temporary directory, listing and classifying them, train_state.json and
// the JSON file helpers. Internal to the checkpoint code.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/checkpointer.h"

namespace titan::ckpt::detail {

void write_json(const std::filesystem::path& path, const nlohmann::json& j);

nlohmann::json read_json(const std::filesystem::path& path);

std::string step_name(int64_t step);

// "step-N" -> N; -1 for other names.
int64_t parse_step(const std::string& name);

// Moves from -> to, throwing titan::Error naming both.
void rename_or_throw(const std::filesystem::path& from, const std::filesystem::path& to);

// Puts the complete directory tmp at dst (see the header: one atomic swap when dst exists).
void commit_dir(const std::filesystem::path& tmp, const std::filesystem::path& dst);

// A fresh, empty step-N.tmp-PID beside dst.
std::filesystem::path temp_sibling(const std::filesystem::path& dst);

// What a step-N directory holds.
enum class Kind { Full, ModelOnly, Incomplete };
struct StepDir {
  int64_t step;
  std::filesystem::path path;
  Kind kind;
  std::string lacks;  // Incomplete: the first missing file
};

// Every step-N directory of folder, sorted by N.
std::vector<StepDir> step_dirs(const std::filesystem::path& folder);

// The newest full checkpoint before `step` ("" message part when there is none).
std::string older_hint(const std::vector<StepDir>& dirs, int64_t step);

// train_state.json of step directory `dir`, every field type-checked.
TrainState read_train_state(const std::filesystem::path& dir, int64_t step);

void write_train_state(const std::filesystem::path& dir, const TrainState& st);

}  // namespace titan::ckpt::detail
