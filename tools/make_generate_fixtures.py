#!/usr/bin/env python3
"""Reference fixtures for `titan generate`, made by the real transformers (tools venv, pinned):

    .venv/bin/python tools/make_generate_fixtures.py --assets ../shared/assets --out tests/fixtures/generate

greedy.json   for HF fixtures (tests/fixtures/hf/NAME): prompts of token ids and the ids that
              model.generate(do_sample=False, max_new_tokens=32) appends (batch 1, no EOS: the
              fixtures' configs have eos_token_id null), fp32, eager attention.
warpers.json  fixed logits and what transformers' TemperatureLogitsWarper, TopKLogitsWarper and
              TopPLogitsWarper (in generate's order) leave of them (-inf written as null).
chat.json     conversations rendered by apply_chat_template with Qwen3's tokenizer_config.json
              (../shared/assets/tokenizers/qwen3), as text and as token ids, with and without the
              generation prompt and thinking.
Deterministic (fixed seeds, one thread).
"""
import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import math

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

HERE = os.path.dirname(os.path.abspath(__file__))


def greedy(out):
    torch.manual_seed(0)
    fixtures = ["tied_gqa2", "untied_gqa4", "tied_hd_eq", "moe_norm", "moe_nonorm_dense1"]
    res = {"transformers": transformers.__version__, "torch": torch.__version__, "max_new_tokens": 32,
           "models": {}}
    for name in fixtures:
        d = os.path.join(HERE, "..", "tests", "fixtures", "hf", name)
        m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32)
        m.eval()
        V = m.config.vocab_size
        g = torch.Generator().manual_seed(len(name) * 7919)
        cases = []
        for n in (1, 5, 12):
            ids = torch.randint(0, V, (1, n), generator=g)
            with torch.no_grad():
                o = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=32, eos_token_id=None, pad_token_id=0)
            cases.append({"prompt": ids[0].tolist(), "generated": o[0, n:].tolist()})
        res["models"][name] = cases
    with open(os.path.join(out, "greedy.json"), "w") as f:
        json.dump(res, f, indent=1)


def warpers(out):
    g = torch.Generator().manual_seed(7)
    V = 40
    distinct = torch.randn(6, V, generator=g) * 3
    rows = distinct.round(decimals=1)  # rounding makes ties (top-k keeps them all)
    settings = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.9), (0.6, 20, 0.95),
                (1.3, 3, 0.5), (1.0, 1, 1.0), (1.0, 0, 0.05)]
    cases = []
    for t, k, p in settings:
        procs = LogitsProcessorList()
        if t != 1.0:
            procs.append(TemperatureLogitsWarper(t))
        if k > 0:
            procs.append(TopKLogitsWarper(top_k=k))
        if p < 1.0:
            procs.append(TopPLogitsWarper(top_p=p))
        # Which of equal logits torch.sort puts last is not specified: top-p gets distinct ones.
        w = procs(None, (rows if p == 1.0 else distinct).clone())
        cases.append({"temperature": t, "top_k": k, "top_p": p,
                      "warped": [[None if math.isinf(x) else x for x in r] for r in w.tolist()]})
    with open(os.path.join(out, "warpers.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "logits": rows.tolist(),
                   "logits_distinct": distinct.tolist(), "cases": cases}, f)


def chat(assets, out):
    tok = AutoTokenizer.from_pretrained(os.path.join(assets, "tokenizers", "qwen3"))
    convs = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}],
        [{"role": "system", "content": ""}, {"role": "user", "content": "Ünïcödé ✓ 日本語?"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "and 3+3?"}],
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello there!"},
         {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "<think>ok</think>Goodbye."}],
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A",
                                            "reasoning_content": "thinking about Q"}],
        [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "Checking."},
         {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "20C"},
         {"role": "user", "content": "thanks"}, {"role": "system", "content": "late system"}],
    ]
    cases = []
    for c in convs:
        for gen in (True, False):
            for think in (True, False):
                text = tok.apply_chat_template(c, tokenize=False, add_generation_prompt=gen,
                                               enable_thinking=think)
                ids = tok(text, add_special_tokens=False)["input_ids"]
                cases.append({"messages": c, "add_generation_prompt": gen, "enable_thinking": think,
                              "text": text, "ids": ids})
    with open(os.path.join(out, "chat.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "cases": cases}, f, ensure_ascii=False,
                  indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    greedy(a.out)
    warpers(a.out)
    chat(a.assets, a.out)
