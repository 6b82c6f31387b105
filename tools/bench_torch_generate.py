#!/usr/bin/env python3
"""transformers' greedy generate on the CPU, timed as `titan generate` reports itself: prefill
tokens/s (the prompt's forward, max_new_tokens=1) and decode tokens/s (the remaining new tokens,
KV cache on), batch 1. For benchmarks/generate_vs_torch.sh.

    .venv/bin/python tools/bench_torch_generate.py --model DIR --dtype float32 --prompt_len 32 --new 64
"""
import os
import argparse
import json
import time

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
ap.add_argument("--prompt_len", type=int, default=32)
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--reps", type=int, default=2)
a = ap.parse_args()
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(a.threads)
m = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype))
m.eval()
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, m.config.vocab_size, (1, a.prompt_len), generator=g)
kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=None, pad_token_id=0)


def timed(n):
    t = time.perf_counter()
    with torch.no_grad():
        m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
    return time.perf_counter() - t


timed(2)  # warm-up
prefill = min(timed(1) for _ in range(a.reps))
full = min(timed(a.new) for _ in range(a.reps))
print(json.dumps({"prefill_tokens_per_s": a.prompt_len / prefill,
                  "decode_tokens_per_s": (a.new - 1) / max(full - prefill, 1e-9),
                  "torch": torch.__version__, "threads": a.threads, "dtype": a.dtype}))
