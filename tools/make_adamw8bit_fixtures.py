#!/usr/bin/env python3
"""Reference steps of 8-bit AdamW from the REAL bitsandbytes (its CPU backend).

    .venv/bin/python tools/make_adamw8bit_fixtures.py --out tests/fixtures/adamw8bit

Runs bitsandbytes.optim.AdamW8bit (block-wise dynamic quantization of both moments) for STEPS
steps on two parameters with fixed gradients, and writes tests/fixtures/adamw8bit/steps.safetensors:
  qmap1, qmap2           f32 [256]   the signed (exp_avg) and unsigned (exp_avg_sq) dynamic maps,
                                     as the optimizer's state holds them after the run
  p<i>.init              f32         parameter i before the first step
  p<i>.grad.<t>          f32         its gradient at step t (1-based)
  p<i>.param.<t>         f32         the parameter after step t
  p<i>.state1.<t>, p<i>.state2.<t>   u8   the moments' codes after step t
  p<i>.absmax1.<t>, p<i>.absmax2.<t> f32  their per-block scales after step t
and config.json (lr, betas, eps, weight_decay, blocksize, steps, bitsandbytes' version).
Both parameters have at least bitsandbytes' min_8bit_size (4096) elements, so both are 8-bit; the
second is not a multiple of the block size (a partial last block). Deterministic: fixed seed, CPU.
"""

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse
import json

import bitsandbytes as bnb
import safetensors.torch
import torch

SEED = 20261206
STEPS = 6
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1
SHAPES = [(48, 128), (5000,)]  # 6144 = 24 blocks of 256; 5000 = 19 blocks + 136


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(SEED)
    params = [torch.nn.Parameter(torch.randn(s) * 0.5) for s in SHAPES]
    opt = bnb.optim.AdamW8bit(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    out = {}
    for i, p in enumerate(params):
        out[f"p{i}.init"] = p.detach().clone()
    for t in range(1, STEPS + 1):
        for i, p in enumerate(params):
            # gradients of changing scale (the moments' blocks see new maxima). No exact zeros:
            # bitsandbytes' CPU quantizer (0.50) rounds x/absmax to 65,536 bins first and stores
            # 0 as ~1.5e-5 × the block's scale, where its CUDA kernels and titan store 0.
            g = torch.randn(p.shape) * (0.1 * t if t % 2 else 1.0 / t)
            p.grad = g
            out[f"p{i}.grad.{t}"] = g.clone()
        opt.step()
        for i, p in enumerate(params):
            st = opt.state[p]
            assert st["state1"].dtype == torch.uint8, "bitsandbytes kept this parameter in 32-bit"
            out[f"p{i}.param.{t}"] = p.detach().clone()
            out[f"p{i}.state1.{t}"] = st["state1"].clone()
            out[f"p{i}.state2.{t}"] = st["state2"].clone()
            out[f"p{i}.absmax1.{t}"] = st["absmax1"].clone()
            out[f"p{i}.absmax2.{t}"] = st["absmax2"].clone()
    st = opt.state[params[0]]
    out["qmap1"] = st["qmap1"].clone()
    out["qmap2"] = st["qmap2"].clone()
    os.makedirs(args.out, exist_ok=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in out.items()},
                                os.path.join(args.out, "steps.safetensors"))
    n_blocks = [int(opt.state[p]["absmax1"].numel()) for p in params]
    cfg = {"lr": LR, "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS, "weight_decay": WD,
           "steps": STEPS, "shapes": [list(s) for s in SHAPES], "blocks": n_blocks,
           "bitsandbytes": bnb.__version__, "torch": torch.__version__}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print(f"wrote {args.out}: bitsandbytes {bnb.__version__}, blocks {n_blocks}")


if __name__ == "__main__":
    main()
