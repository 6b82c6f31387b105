#!/usr/bin/env python3
"""Reference training-step speed of PyTorch + Hugging Face Transformers on this CPU (or GPU).

Builds transformers' real Qwen3ForCausalLM from a Qwen3Config (random init, fp32,
CPU, SDPA attention, no KV cache) and times full training steps:
forward with labels (HF's shifted cross-entropy) -> backward ->
clip_grad_norm_(1.0) -> AdamW step -> zero_grad.

With --lora R the model is wrapped by the real PEFT (get_peft_model, LoraConfig(r=R,
lora_alpha=2R, the seven projections, no dropout)): the base frozen, AdamW and clipping over the
adapters only (what titan's lora.rank trains).

With --dtype bfloat16 the forward and loss run under torch.autocast("cpu", dtype=torch.bfloat16)
(PyTorch's bf16 mixed precision over fp32 weights, what torchtitan uses on one device) and the
roofline is a bf16 matmul.

With --device cuda the model, batches and optimizer live on the GPU; autocast is CUDA's; the
roofline is an 8192^3 matmul there; --compile wraps the model in torch.compile (the first
warm-up steps include its compilation). scripts/gpu-train-check.sh runs it on the lent GPU.

Run inside the venv made by tools/setup_venv.sh:
    .venv/bin/python tools/bench_torch.py --preset debugmodel --batch 4 --seq 256
    .venv/bin/python tools/bench_torch.py --preset debugmodel --batch 4 --seq 256 --dtype bfloat16

stdout: exactly one JSON line with keys preset, batch, seq, threads,
torch_version, transformers_version, dtype, step_s, tokens_per_s, tflops, gemm_flops,
flops_per_token, lora, device, compile, peak_rss_gib (the process's peak resident set), and with
cuda peak_gpu_gib (torch.cuda.max_memory_allocated). Human-readable progress (incl. the first step's loss, which
should be close to ln(vocab)) goes to stderr.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

PRESETS = {
    # Same shapes as titan.cpp's / torchtitan's qwen3 "debugmodel".
    "debugmodel": dict(
        vocab_size=2048, hidden_size=256, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, tie_word_embeddings=True,
        rope_theta=1e6, rms_norm_eps=1e-6,
    ),
    # torchtitan's "debugmodel_moe": every layer sparse, 64 experts, top-8, renormalised, untied.
    "debugmodel_moe": dict(
        vocab_size=2048, hidden_size=256, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, moe_intermediate_size=768, num_experts=64,
        num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
        rope_theta=1e6, rms_norm_eps=1e-6,
    ),
    # Qwen3-1.7B (torchtitan's "1.7B" flavor: 28 layers, dim 2048, tied).
    "1.7B": dict(
        vocab_size=151936, hidden_size=2048, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=6144, tie_word_embeddings=True,
        rope_theta=1e6, rms_norm_eps=1e-6,
    ),
    # Qwen3-0.6B widths with only 2 layers.
    "0.6b-2layer": dict(
        vocab_size=151936, hidden_size=1024, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, tie_word_embeddings=True,
        rope_theta=1e6, rms_norm_eps=1e-6,
    ),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_model(preset, device="cpu"):
    p = dict(PRESETS[preset])
    rope_theta = p.pop("rope_theta")
    moe = "num_experts" in p
    cfg = (Qwen3MoeConfig if moe else Qwen3Config)(
        **p,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        max_position_embeddings=32768,
        use_cache=False,
        attention_dropout=0.0,
        attn_implementation="sdpa",
    )
    model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(cfg).to(dtype=torch.float32, device=device)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    assert model.config.rope_parameters["rope_theta"] == rope_theta, model.config.rope_parameters
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == cfg.tie_word_embeddings, "tie_word_embeddings not honoured"
    model.train()
    return model, cfg


def flops_per_token(model, cfg, seq):
    """torchtitan's estimate: 6*N + 6*L*n_heads*2*head_dim*seq.

    N counts every parameter once (model.parameters() de-duplicates the tied
    embedding/lm_head); for an untied model the input embedding is excluded
    (it is a lookup, not a matmul)."""
    n = sum(p.numel() for p in model.parameters())
    if getattr(cfg, "num_experts", 0):  # MoE: only top_k of E experts are active per token
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
        n -= experts - experts * cfg.num_experts_per_tok // cfg.num_experts
    if not cfg.tie_word_embeddings:
        n -= model.model.embed_tokens.weight.numel()
    attn = 6 * cfg.num_hidden_layers * cfg.num_attention_heads * 2 * cfg.head_dim * seq
    return 6 * n + attn, n


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def gemm_roofline(n=2048, trials=3, dtype=torch.float32, device="cpu"):
    """torch.matmul of n x n matrices in dtype: best of `trials` after warm-up, FLOP/s."""
    a = torch.randn(n, n, dtype=torch.float32, device=device).to(dtype)
    b = torch.randn(n, n, dtype=torch.float32, device=device).to(dtype)
    for _ in range(2):
        torch.matmul(a, b)
    best = float("inf")
    for _ in range(trials):
        sync(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="debugmodel")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median is reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: all usable cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="bfloat16: forward and loss under torch.autocast (bf16 mixed precision)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="train PEFT LoRA adapters of rank R on the frozen model (0: full training)")
    args = ap.parse_args()
    amp = args.dtype == "bfloat16"
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.seq < 2:
        ap.error("need --steps >= 1, --warmup >= 0, --batch >= 1, --seq >= 2")

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)

    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    model, cfg = build_model(args.preset, dev)
    fpt, nparams = flops_per_token(model, cfg, args.seq)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {threads}, "
        f"preset {args.preset}: {nparams / 1e6:.2f}M params (counted), "
        f"{fpt / 1e9:.3f} GFLOP/token")

    if args.lora:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        log(f"peft {peft.__version__}: LoRA r={args.lora}, "
            f"{sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.2f}M trainable")
    trainable = [p for p in model.parameters() if p.requires_grad]
    run_model = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(trainable, lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)

    def step():
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
            out = run_model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    times = []
    first_loss = None
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        if first_loss is None:
            first_loss = loss
            log(f"first_step_loss {loss:.4f} (ln(vocab) = {math.log(cfg.vocab_size):.4f})")
        timed = i >= args.warmup
        if timed:
            times.append(dt)
        log(f"step {i + 1}/{args.warmup + args.steps}{'' if timed else ' (warm-up)'}: "
            f"{dt:.3f} s, loss {loss:.4f}")

    step_s = statistics.median(times)
    tokens_per_s = args.batch * args.seq / step_s
    tflops = fpt * tokens_per_s / 1e12
    n = 8192 if dev == "cuda" else 2048
    gemm = gemm_roofline(n=n, dtype=torch.bfloat16 if amp else torch.float32, device=dev)
    log(f"{'bf16' if amp else 'fp32'} GEMM {n}^3 roofline: {gemm / 1e9:.1f} GFLOP/s; "
        f"training achieves {100 * tflops * 1e12 / gemm:.1f}% of it")

    print(json.dumps({
        "preset": args.preset,
        "batch": args.batch,
        "seq": args.seq,
        "threads": threads,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "dtype": args.dtype,
        "step_s": round(step_s, 6),
        "tokens_per_s": round(tokens_per_s, 3),
        "tflops": round(tflops, 6),
        "gemm_flops": round(gemm, 1),
        "flops_per_token": fpt,
        "lora": args.lora,
        "device": dev,
        "compile": args.compile,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 4),
        **({"peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 4)} if dev == "cuda" else {}),
    }), flush=True)


if __name__ == "__main__":
    main()
