#!/usr/bin/env python3
"""The routed experts of one Qwen3-MoE layer, forward + backward, in PyTorch on this CPU: the peer
rows for titan's grouped-experts op (benchmarks/bench_experts.cpp, benchmarks/experts_vs_torch.sh).

Transformers' own Qwen3MoeExperts module (gate_up_proj [E, 2F, D], down_proj [E, D, F]) is timed
under each of its experts implementations that runs on this CPU:
  eager       the per-expert loop of modeling_qwen3_moe.py (index, two linears, index_add_)
  grouped_mm  tokens sorted by expert, torch's grouped GEMM (torch._grouped_mm / F.grouped_mm)
  batched_mm  one batched GEMM over the (token, slot) pairs with each pair's expert weights
The routing is the benchmark's: each token picks K distinct experts uniformly at random (seed 0),
or with --skewed half the tokens send their first slot to expert 0. Weights and activations are
bf16 (or fp32 with --dtype float32); the loss is sum(y * dy) for a fixed random dy, so the
backward computes dx, the routing weights' gradient and both weight gradients, as titan's does.

Prints one line per implementation: ms per forward + backward (median of --iters after one
warm-up) and TFLOP/s counted as 18·T·K·D·F (the useful FLOPs; batched_mm does no more than that).
"""
import argparse
import statistics
import time

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts


def routing(T, E, K, skewed, g):
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    if skewed:
        for t in range(0, T, 2):
            row = idx[t]
            hit = (row == 0).nonzero()
            if len(hit):
                j = int(hit[0])
                row[j], row[0] = row[0].clone(), 0
            else:
                row[0] = 0
    return idx


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=2048, help="tokens")
    ap.add_argument("--D", type=int, default=2048, help="model dim")
    ap.add_argument("--F", type=int, default=768, help="expert hidden dim")
    ap.add_argument("--E", type=int, default=64, help="experts")
    ap.add_argument("--K", type=int, default=4, help="experts per token")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--skewed", action="store_true")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--impls", default="grouped_mm,batched_mm,eager")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=a.D, moe_intermediate_size=a.F, num_experts=a.E,
                         num_experts_per_tok=a.K, hidden_act="silu")
    experts = Qwen3MoeExperts(cfg).to(dtype)
    with torch.no_grad():
        experts.gate_up_proj.uniform_(-0.05, 0.05, generator=g)
        experts.down_proj.uniform_(-0.05, 0.05, generator=g)
    x0 = (torch.rand(a.T, a.D, generator=g) * 2 - 1).to(dtype)
    w0 = torch.rand(a.T, a.K, generator=g).to(dtype)
    dy = (torch.rand(a.T, a.D, generator=g) * 2 - 1).to(dtype)
    idx = routing(a.T, a.E, a.K, a.skewed, g)
    rows = torch.bincount(idx.flatten(), minlength=a.E)
    flops = 18.0 * a.T * a.K * a.D * a.F
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.dtype}, "
          f"T={a.T} D={a.D} F={a.F} E={a.E} K={a.K}, rows per expert max {int(rows.max())} "
          f"mean {a.T * a.K / a.E:g}")
    for impl in a.impls.split(","):
        cfg._experts_implementation = impl
        experts.config = cfg

        def step():
            experts.zero_grad(set_to_none=True)
            x = x0.clone().requires_grad_(True)
            w = w0.clone().requires_grad_(True)
            y = experts(x, idx, w)
            (y.float() * dy.float()).sum().backward()

        try:
            step()
        except Exception as e:  # an implementation this torch cannot run on the CPU
            print(f"{impl}: not available ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        times = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
        print(f"{impl}: {ms:.1f} ms per forward + backward, {flops / ms / 1e9:.3f} TFLOP/s")


if __name__ == "__main__":
    main()
