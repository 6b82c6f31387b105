#!/usr/bin/env python3
"""Reference fixtures for chat fine-tuning (dataloader.dataset chat), made by the real
transformers and tokenizers (tools venv, pinned):

    .venv/bin/python tools/make_sft_fixtures.py [--assets DIR] [--out tests/fixtures/sft]

chat_mask.json  chat records (the JSON lines titan reads: `messages`, or `prompt` + `completion`)
                with what the Qwen3 tokenizer (../shared/assets/tokenizers/qwen3) makes of them:
                - text: the rendering F. Messages: apply_chat_template(msgs, tokenize=False).
                  Conversational prompt + completion: the same over prompt + completion.
                  Plain prompt + completion strings: prompt + completion + eos_token (TRL's
                  non-conversational prompt-completion).
                - ids: F tokenized whole by the fast tokenizer (add_special_tokens=False).
                - trained: per id, 1 when its offsets (return_offsets_mapping) lie inside a
                  trained span. For assistant message k (of the completion only, for prompt +
                  completion records) the span starts at
                  len(apply_chat_template(msgs[:k], add_generation_prompt=True, tokenize=False))
                  (F must start with that prefix: the header "<|im_start|>assistant\\n" is not
                  trained) and ends after the first "<|im_end|>" from there (trained; the "\\n"
                  after it is not). Plain strings: from len(prompt) to the end (EOS included).
                  Qwen3's template has no {% generation %} markers, so this is built from the
                  prefix renderings, never from return_assistant_tokens_mask or titan's own code.
                - labels: the loader's labels of one unpacked row: labels[j] = ids[j+1] when
                  id j+1 is trained, else -100 (len(ids) - 1 of them).
"""
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

RECORDS = [
    # single turn
    {"messages": [{"role": "user", "content": "Hello!"},
                  {"role": "assistant", "content": "Hi there. How can I help?"}]},
    # a system message
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Name a prime."},
                  {"role": "assistant", "content": "7"}]},
    # an empty system message, unicode
    {"messages": [{"role": "system", "content": ""},
                  {"role": "user", "content": "Ünïcödé ✓ 日本語?"},
                  {"role": "assistant", "content": "Ja: 日本語 ✓ — ça va, naïve café 🙂."}]},
    # multi-turn
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "and 3+3?"},
                  {"role": "assistant", "content": "6, of course."}]},
    # multi-turn with a system message and reasoning in the content (the earlier turn loses it)
    {"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant",
                   "content": "<think>\nThe user greets.\n</think>\n\nHello there!"},
                  {"role": "user", "content": "Bye"},
                  {"role": "assistant", "content": "<think>ok</think>Goodbye."}]},
    # reasoning_content
    {"messages": [{"role": "user", "content": "Q"},
                  {"role": "assistant", "content": "A", "reasoning_content": "thinking about Q"}]},
    # reasoning_content on two turns, the first one before the last user query
    {"messages": [{"role": "user", "content": "What is 6*7?"},
                  {"role": "assistant", "content": "42.", "reasoning_content": "6*7 = 42"},
                  {"role": "user", "content": "And halved?"},
                  {"role": "assistant", "content": "21.", "reasoning_content": "42 / 2 = 21"}]},
    # assistant content opening with line breaks and spaces (an earlier turn: rendered raw)
    {"messages": [{"role": "user", "content": "indent"},
                  {"role": "assistant", "content": "\n\n  indented\nreply"},
                  {"role": "user", "content": "again"},
                  {"role": "assistant", "content": " \n\t spaced"}]},
    {"messages": [{"role": "user", "content": "a"},
                  {"role": "assistant", "content": "\n\n  indented\nreply"},
                  {"role": "user", "content": "b"}, {"role": "assistant", "content": " \n\tspaced"},
                  {"role": "user", "content": "c"}, {"role": "assistant", "content": "done"}]},
    # an empty assistant turn, then a tool round
    {"messages": [{"role": "user", "content": "weather?"},
                  {"role": "assistant", "content": ""},
                  {"role": "user", "content": "weather, please?"},
                  {"role": "assistant", "content": "Checking."},
                  {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "20C"},
                  {"role": "assistant", "content": "Sunny, 20C."}]},
    # plain prompt + completion strings
    {"prompt": "The capital of France is", "completion": " Paris."},
    {"prompt": "Translate to French: cheese =>", "completion": " fromage\n"},
    # conversational prompt + completion (an assistant turn in the prompt is not trained)
    {"prompt": [{"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "Colour of the sky?"}],
     "completion": [{"role": "assistant", "content": "Blue."}]},
    {"prompt": [{"role": "user", "content": "Say A."}, {"role": "assistant", "content": "A."},
                {"role": "user", "content": "Say B."}],
     "completion": [{"role": "assistant", "content": "B."}]},
]


def reference(tok, rec):
    if "messages" in rec:
        msgs, first_trained, plain = rec["messages"], 0, False
    elif isinstance(rec["prompt"], str):
        msgs, plain = None, True
    else:
        msgs, first_trained, plain = rec["prompt"] + rec["completion"], len(rec["prompt"]), False
    spans = []
    if plain:
        text = rec["prompt"] + rec["completion"] + tok.eos_token
        spans.append((len(rec["prompt"]), len(text)))
    else:
        text = tok.apply_chat_template(msgs, tokenize=False)
        for k, m in enumerate(msgs):
            if m["role"] != "assistant" or k < first_trained:
                continue
            prefix = tok.apply_chat_template(msgs[:k], tokenize=False, add_generation_prompt=True)
            assert text.startswith(prefix), (rec, prefix)
            start = len(prefix)
            end = text.index("<|im_end|>", start) + len("<|im_end|>")
            spans.append((start, end))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    trained = [int(any(a <= s and e <= b for a, b in spans)) for s, e in offsets]
    # Every span's characters are covered by trained tokens, save a token straddling its start.
    labels = [ids[j + 1] if trained[j + 1] else -100 for j in range(len(ids) - 1)]
    return {"record": rec, "text": text, "ids": ids, "trained": trained, "labels": labels,
            "spans": spans}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", default=os.environ.get("TITAN_ASSETS") or
                    os.path.join(ROOT, "..", "shared", "assets"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "sft"))
    a = ap.parse_args()
    path = os.path.join(a.assets, "tokenizers", "qwen3")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        sys.exit(f"missing {path}/tokenizer.json (set TITAN_ASSETS or pass --assets)")
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.is_fast
    cases = [reference(tok, r) for r in RECORDS]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "chat_mask.json"), "w") as f:
        json.dump({"generator": "tools/make_sft_fixtures.py",
                   "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                   "eos_token": tok.eos_token, "cases": cases}, f, ensure_ascii=False, indent=1)
    n = sum(len(c["ids"]) for c in cases)
    t = sum(sum(c["trained"]) for c in cases)
    print(f"{len(cases)} records, {n} tokens, {t} trained")


if __name__ == "__main__":
    main()
