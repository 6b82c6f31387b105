#!/usr/bin/env python3
"""Writes a randomly initialized transformers Qwen3ForCausalLM with a released model's shape,
saved with save_pretrained (safetensors), for load-speed measurements of titan's HF path.

    .venv/bin/python tools/make_random_hf_model.py --preset 0.6B --dtype bfloat16 --out /tmp/qwen3-0.6b-random
"""
import argparse

import torch
import transformers

PRESETS = {
    # Qwen3-0.6B's published config.json values (qwen3-hf.md §6).
    "0.6B": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 max_position_embeddings=40960, tie_word_embeddings=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="0.6B", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    cfg = transformers.Qwen3Config(**PRESETS[args.preset], rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                   rms_norm_eps=1e-6, attention_bias=False, use_sliding_window=False)
    torch.set_default_dtype(dtype)
    model = transformers.Qwen3ForCausalLM(cfg).to(dtype)
    model.save_pretrained(args.out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {n:,} parameters in {args.dtype}")


if __name__ == "__main__":
    main()
