#!/usr/bin/env python3
"""Loads a LoRA adapter directory written by titan onto its Transformers base model with the REAL
peft.PeftModel.from_pretrained and compares the adapted model's logits with titan's.

    .venv/bin/python tools/check_peft_adapter.py BASE_DIR ADAPTER_DIR LOGITS.safetensors [--tol 1e-5]

LOGITS.safetensors holds input_ids (int64 [B,S]) and logits (f32 [B,S,V], titan's). Exits 1 when PEFT
reports missing or unexpected adapter keys, when a loaded adapter tensor differs from the file, or
when max |logits - titan's| exceeds --tol. Prints one line with the figures.
"""

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import sys
import warnings

import peft
import safetensors.torch
import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("adapter")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    base = transformers.AutoModelForCausalLM.from_pretrained(
        a.base, dtype=torch.float32, attn_implementation="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = peft.PeftModel.from_pretrained(base, a.adapter)
    bad = [str(w.message) for w in caught if "key" in str(w.message).lower()]
    if bad:
        print("PEFT reported key problems: " + " | ".join(bad))
        return 1
    model.eval()
    file = safetensors.torch.load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    loaded = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
    if set(loaded) != set(file):
        print(f"adapter keys differ: only in the model {sorted(set(loaded) - set(file))[:3]}, "
              f"only in the file {sorted(set(file) - set(loaded))[:3]}")
        return 1
    for k, t in file.items():
        if not torch.equal(loaded[k].detach().float(), t.float()):
            print(f"{k}: loaded tensor differs from the file")
            return 1
    ref = safetensors.torch.load_file(a.logits)
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"]).logits.float()
    diff = float((logits - ref["logits"]).abs().max())
    print(f"peft {peft.__version__}: {len(file)} adapter tensors loaded, max |logits - titan| = {diff:.3g} "
          f"(tol {a.tol:g})")
    return 0 if diff <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
