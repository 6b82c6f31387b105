// Test-only fault injection for the kill/resume tests: with TITAN_TEST_KILL_AT=NAME (or NAME@N)
// in the environment, the process sends itself SIGKILL the first (N-th) time it reaches
// kill_point(NAME), a crash at exactly that moment. Without the variable a kill point costs one
// comparison. Points: step:backward (gradients computed, parameters not yet updated),
// save:model / save:optimizer / save:train_state / save:checksums (after that file of a
// checkpoint is written), save:replace (an existing step-N swapped out, not yet removed),
// save:purge (while removing an older checkpoint), export:model / export:config (in an export),
// write:partial (half of a checkpoint file written), metrics:partial (half a metrics line
// written), metrics:rewrite (the trimmed metrics file written, not yet renamed).
#pragma once

namespace titan::test {

// True when the process should die at this point now (counts the visits to NAME).
bool kill_due(const char* name);
// SIGKILL to this process.
[[noreturn]] void kill_now();
inline void kill_point(const char* name) {
  if (kill_due(name)) kill_now();
}
// Whether TITAN_TEST_DISABLE (comma-separated) names this feature, to test a fallback path:
// rename_exchange (replace a checkpoint step with two renames, as on a file system without
// renameat2 RENAME_EXCHANGE).
bool disabled(const char* feature);

}  // namespace titan::test
