// Shared test helpers.
#pragma once
#include "titan/config/job_config.h"

namespace titan::testing {

// A job on a tiny Qwen3 (2 layers, dim 32, 4/2 heads of 16, hidden 64, vocab 260 — room for the
// byte tokenizer) without a metrics file; tests set batch, sequence, steps and seed themselves.
inline config::JobConfig tiny_model_job() {
  config::JobConfig c;
  c.model.n_layers = 2;
  c.model.dim = 32;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.head_dim = 16;
  c.model.hidden_dim = 64;
  c.model.vocab_size = 260;
  c.metrics.enable_jsonl = false;
  return c;
}

}  // namespace titan::testing
