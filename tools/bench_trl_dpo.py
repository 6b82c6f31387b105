#!/usr/bin/env python3
"""Reference DPO training speed of TRL's DPOTrainer on this CPU (benchmarks/dpo_vs_trl.sh).

Builds transformers' Qwen3ForCausalLM from a Qwen3Config (random init, seed 0) and trains it
with the real trl.DPOTrainer on a preference JSONL (plain text, titan's dpo.enable format),
tokenized with the Qwen3 tokenizer: loss_type sigmoid, beta 0.1, per_device_train_batch_size
pairs per step, no gradient accumulation, AdamW, max_length MAX_LEN, the reference
log-probabilities precomputed once before training (precompute_ref_log_probs, what titan does for
full fine-tuning), no gradient checkpointing, dropout off. --dtype bfloat16: TRL's bf16 (torch
autocast over fp32 weights), as titan's bf16 mixed precision.

Each optimizer step is timed (a TrainerCallback); the first WARMUP are left out.

stdout: one JSON line: trl_version, transformers_version, torch_version, dtype, threads, pairs,
step_s (median), pairs_per_s, tokens_per_s (every token of both rows of each pair through the
model per step), peak_rss_gib, losses (per step).
"""
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time

import torch
import transformers
import trl
from datasets import load_dataset
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, TrainerCallback

from bench_torch import PRESETS  # the same shapes as the other benchmarks (this directory)

class Timer(TrainerCallback):
    def __init__(self):
        self.times, self.t0 = [], None

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--preset", default="0.6b-2layer", choices=PRESETS)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    model = Qwen3ForCausalLM(Qwen3Config(**PRESETS[a.preset], attn_implementation="sdpa"))
    ds = load_dataset("json", data_files=a.data, split="train")
    timer = Timer()
    with tempfile.TemporaryDirectory() as out:
        cfg = trl.DPOConfig(
            output_dir=out, report_to=[], per_device_train_batch_size=a.batch,
            gradient_accumulation_steps=1, max_steps=a.steps + a.warmup, learning_rate=1e-6,
            lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
            bf16=a.dtype == "bfloat16", use_cpu=True, gradient_checkpointing=False,
            precompute_ref_log_probs=True, max_length=a.max_len, beta=0.1,
            loss_type=["sigmoid"], dataloader_num_workers=0, seed=0,
        )
        trainer = trl.DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                                 callbacks=[timer])
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # The tokens of the timed steps: the first (steps + warmup) · batch pairs in TRL's order are
    # shuffled, so count the mean pair (every pair has the same lengths in the benchmark's data).
    rows = [json.loads(l) for l in open(a.data)]
    n_tok = []
    for r in rows[: a.batch]:
        p = len(tok(r["prompt"])["input_ids"])
        c = len(tok(r["prompt"] + r["chosen"] + tok.eos_token)["input_ids"])
        j = len(tok(r["prompt"] + r["rejected"] + tok.eos_token)["input_ids"])
        n_tok.append(min(c, a.max_len) + min(j, a.max_len))
    step_tokens = sum(n_tok)
    step_s = statistics.median(timer.times[a.warmup:])
    print(json.dumps(dict(
        trl_version=trl.__version__, transformers_version=transformers.__version__,
        torch_version=torch.__version__, dtype=a.dtype, threads=torch.get_num_threads(),
        pairs=a.batch, step_s=step_s, pairs_per_s=a.batch / step_s,
        tokens_per_s=step_tokens / step_s,
        peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        losses=losses,
    )))


if __name__ == "__main__":
    sys.exit(main())
