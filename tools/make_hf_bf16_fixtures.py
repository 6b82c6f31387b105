#!/usr/bin/env python3
"""bf16 autocast references for the Hugging Face fixtures (tests/fixtures/hf/*/).

For every fixture directory made by tools/make_hf_fixtures.py, loads the saved model with the REAL
transformers code (fp32 weights), runs the fixture's batch (expected.safetensors: input_ids,
labels; positions 0..S-1, no attention mask) under

    torch.autocast("cpu", dtype=torch.bfloat16)

-- PyTorch's bf16 mixed precision, the single-device form of torchtitan's
mixed_precision_param = "bfloat16": Linear layers take bf16-rounded inputs and weights, the loss is
computed on logits upcast to fp32 -- and writes expected_bf16.safetensors beside it:

    logits   f32 [B, S, V]   the autocast logits (bf16 values), upcast to fp32
    loss     f32 []          HF ForCausalLMLoss under autocast (MoE with aux: CE + coef * aux)

titan's bf16 mode is checked against these in tests/models/qwen3/hf_parity_test.cpp.
Deterministic (one thread, deterministic algorithms). Run with the project's venv:

    .venv/bin/python tools/make_hf_bf16_fixtures.py tests/fixtures/hf
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import sys

import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


def make(fdir):
    exp = safetensors.torch.load_file(os.path.join(fdir, "expected.safetensors"))
    input_ids, labels = exp["input_ids"], exp["labels"]
    S = input_ids.shape[1]
    model = AutoModelForCausalLM.from_pretrained(fdir, dtype=torch.float32)
    model.train()  # dropout is 0 everywhere; as in make_hf_fixtures.py
    position_ids = torch.arange(S, dtype=torch.int64).unsqueeze(0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=input_ids, labels=labels, position_ids=position_ids,
                    attention_mask=None, use_cache=False)
    assert out.logits.dtype == torch.bfloat16, out.logits.dtype
    tensors = {"logits": out.logits.float().contiguous(),
               "loss": out.loss.float().detach().clone().contiguous()}
    meta = {"format": "pt", "autocast": "cpu bfloat16", "torch": torch.__version__,
            "transformers": transformers.__version__}
    path = os.path.join(fdir, "expected_bf16.safetensors")
    safetensors.torch.save_file(tensors, path + ".tmp", metadata=meta)
    os.replace(path + ".tmp", path)
    fp32 = exp["loss"].item()
    print(f"{os.path.basename(fdir):18s} loss fp32 {fp32:.6f} autocast bf16 {out.loss.item():.6f} "
          f"(rel {abs(out.loss.item() - fp32) / fp32:.2e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="tests/fixtures/hf")
    args = ap.parse_args()
    dirs = sorted(d for d in os.listdir(args.root)
                  if os.path.isfile(os.path.join(args.root, d, "expected.safetensors")))
    if not dirs:
        sys.exit(f"make_hf_bf16_fixtures: no fixture directories under {args.root}")
    for d in dirs:
        make(os.path.join(args.root, d))


if __name__ == "__main__":
    main()
