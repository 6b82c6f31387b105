#include "titan/train/evaluate.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/data/dataset.h"
#include "titan/data/packed_loader.h"
#include "titan/models/registry.h"
#include "titan/train/validator.h"
#include "titan/train/weights_check.h"

namespace titan::train {
namespace {

std::vector<int32_t> read_ids(const ckpt::TensorView& t, const std::string& file) {
  check(t.shape.size() == 2, file + ": tensor '" + t.name + "' must be 2-D [batch, seq]");
  std::vector<int32_t> ids(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype == DType::I64) {
      int64_t v;
      std::memcpy(&v, t.data + 8 * i, 8);
      ids[i] = static_cast<int32_t>(v);
    } else if (t.dtype == DType::I32) {
      std::memcpy(&ids[i], t.data + 4 * i, 4);
    } else {
      throw Error(file + ": tensor '" + t.name + "' must be I64 or I32");
    }
  }
  return ids;
}

void load_weights(models::Model& m, const config::JobConfig& cfg) {
  if (!cfg.checkpoint.initial_load_path.empty())
    ckpt::load_model_and_adapter(m, cfg.checkpoint.initial_load_path,
                                 cfg.checkpoint.initial_load_in_hf, cfg.lora.adapter_path);
  else if (!cfg.model.hf_assets_path.empty())
    ckpt::load_model_and_adapter(m, cfg.model.hf_assets_path, true, cfg.lora.adapter_path);
  else
    throw Error(
        "titan eval needs weights: set model.hf_assets_path (a Hugging Face directory) or "
        "checkpoint.initial_load_path");
}

}  // namespace

// titan eval from start to end (config, model, weights, data, the loss loop, the logits file),
// each step a few lines over shared locals; kept whole like the trainer's loop.
EvalResult evaluate(const config::JobConfig& cfg) {
  models::validate_model_config(cfg);
  // The model as every command builds it (module tree, overrides, ops); weights loaded after.
  auto build = [&](config::JobConfig c, int64_t B, int64_t S) {
    c.training.local_batch_size = B;
    c.training.seq_len = S;
    models::BuildOptions o;
    o.batch = B;
    o.seq_len = S;
    o.loss_chunks = c.loss.num_chunks;
    o.init = false;
    o.device = c.training.device;  // forward passes run there too
    std::unique_ptr<models::Model> m = models::build_model(c, o);
    load_weights(*m, c);
    return m;
  };
  EvalResult r;
  double sum = 0;
  int64_t count = 0;
  // A non-finite loss is the weights' fault (the data are ids in range): say which.
  auto check_finite = [&](const models::Model& m, double loss) {
    if (std::isfinite(loss)) return;
    const std::string from =
        !cfg.checkpoint.initial_load_path.empty()
            ? "checkpoint.initial_load_path '" + cfg.checkpoint.initial_load_path + "'"
            : "model.hf_assets_path '" + cfg.model.hf_assets_path + "'";
    const std::string bad = describe_nonfinite_weights(m);
    const char* value = std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf";
    throw Error(std::string("the loss is not finite (") + value + "): the weights from " + from +
                (bad.empty() ? std::string(" give non-finite activations (no weight is non-finite; "
                                           "look for huge values)")
                             : " hold " + bad) +
                "; check them");
  };
  if (!cfg.eval.tokens_path.empty()) {
    if (!cfg.eval.logits_out.empty())
      io::check_not_input(cfg.eval.logits_out, "eval.logits_out", cfg.eval.tokens_path,
                          "eval.tokens_path");
    ckpt::SafetensorsSet set = ckpt::SafetensorsSet::open(cfg.eval.tokens_path);
    const ckpt::TensorView* ids_t = set.find("input_ids");
    check(ids_t, cfg.eval.tokens_path + ": no tensor 'input_ids'");
    std::vector<int32_t> input = read_ids(*ids_t, cfg.eval.tokens_path);
    const int64_t B = ids_t->shape[0], S = ids_t->shape[1], T = B * S;
    std::vector<int32_t> hf_labels = input;
    if (const ckpt::TensorView* l = set.find("labels")) {
      check(l->shape == ids_t->shape,
            cfg.eval.tokens_path + ": labels and input_ids differ in shape");
      hf_labels = read_ids(*l, cfg.eval.tokens_path);
    }
    std::vector<int32_t> labels(T), positions(T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        labels[b * S + s] = s + 1 < S ? hf_labels[b * S + s + 1] : ops::kIgnoreIndex;
        positions[b * S + s] = static_cast<int32_t>(s);
      }
    config::JobConfig causal = cfg;
    causal.model.attn_mask_type = "causal";
    std::unique_ptr<models::Model> m = build(causal, B, S);
    const int64_t V = m->vocab_size();
    models::Batch batch{B, S, input.data(), labels.data(), positions.data()};
    ops::LossSum ls = m->forward_loss(batch);
    sum = ls.sum;
    count = ls.count;
    check_finite(*m, sum);
    if (!cfg.eval.logits_out.empty()) {
      std::vector<float> logits(static_cast<size_t>(T * V));
      m->forward_logits(batch, logits.data());
      std::vector<int64_t> ids64(input.begin(), input.end());
      ckpt::write_file(cfg.eval.logits_out, {{"input_ids", DType::I64, {B, S}, ids64.data()},
                                             {"logits", DType::F32, {B, S, V}, logits.data()}});
      log::info("eval: wrote the logits to " + cfg.eval.logits_out + " (computed with " +
                cfg.training.mixed_precision_param + " weights" +
                (cfg.training.mixed_precision_param == "float32"
                     ? ")"
                     : "; compared with Transformers' fp32 forward they differ by bf16 rounding: "
                       "--training.mixed_precision_param float32 for tools/check_hf_export.py)"));
    }
  } else {
    const auto& t = cfg.training;
    std::unique_ptr<models::Model> m = build(cfg, t.local_batch_size, t.seq_len);
    auto docs = data::open_dataset(dataloader_spec(cfg));
    check_vocab_fits(*docs, m->vocab_size());
    data::LoaderOptions lo;
    lo.batch = t.local_batch_size;
    lo.seq_len = t.seq_len;
    lo.shuffle = false;
    data::PackedLoader loader(std::move(docs), lo);
    const int64_t T = t.local_batch_size * t.seq_len;
    std::vector<int32_t> in(T), lab(T), pos(T);
    check(cfg.eval.steps > 0, "eval.steps must be positive");
    for (int64_t i = 0; i < cfg.eval.steps; ++i) {
      loader.next(in.data(), lab.data(), pos.data());
      ops::LossSum ls =
          m->forward_loss({t.local_batch_size, t.seq_len, in.data(), lab.data(), pos.data()});
      sum += ls.sum;
      count += ls.count;
      check_finite(*m, sum);
    }
  }
  check(count > 0, "nothing to evaluate: every label is -100");
  r.loss = sum / static_cast<double>(count);
  r.perplexity = std::exp(r.loss);
  r.tokens = count;
  return r;
}

}  // namespace titan::train
