// titan eval: the mean loss and perplexity of a model (a Hugging Face directory or a titan
// checkpoint) over dataset batches, or over given token ids, optionally writing their logits.
#pragma once
#include "titan/config/job_config.h"

namespace titan::train {

struct EvalResult {
  double loss = 0, perplexity = 0;
  int64_t tokens = 0;
};

// Weights: checkpoint.initial_load_path (HF when checkpoint.initial_load_in_hf), else the
// Hugging Face directory model.hf_assets_path. With eval.tokens_path: a safetensors file holding
// input_ids [B,S] (I64 or I32) and optionally labels [B,S] (Hugging Face convention: position t
// predicts labels[t+1]; -100 ignored; default labels = input_ids); eval.logits_out then receives
// input_ids and logits [B,S,V] (F32). Without it: eval.steps batches of the dataset. The model
// computes on training.device.
EvalResult evaluate(const config::JobConfig& cfg);

}  // namespace titan::train
