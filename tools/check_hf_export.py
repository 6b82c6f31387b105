#!/usr/bin/env python3
"""Check a Hugging Face model directory exported by titan.cpp with the real transformers library.

    .venv/bin/python tools/check_hf_export.py EXPORT_DIR [--logits OURS.safetensors] [--atol 1e-4]

(a) Loads EXPORT_DIR (config.json + model.safetensors or sharded safetensors with index) with
    AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, output_loading_info=True) and fails if the
    loading report lists any missing, unexpected or shape-mismatched key or error message. The only
    tolerated entry is a missing `lm_head.weight` when the config has tie_word_embeddings=true.
    It also reads the safetensors headers itself: every stored name must be a model parameter, and a
    tied model that stores `lm_head.weight` must store it equal to `model.embed_tokens.weight` (otherwise
    HF silently unties them).
(b) With --logits FILE (a safetensors file holding `input_ids` int [B,S] and `logits` float [B,S,V], e.g.
    titan.cpp's logits, or a fixture's expected.safetensors), runs the HF forward on input_ids
    (eager attention, fp32, position_ids = arange(S), no mask, use_cache=False) and compares: prints the max
    absolute difference and fails if it exceeds --atol.

Exit status: 0 and a one-line JSON summary on stdout on success; 1 on a logits mismatch; 2 on a loading
problem (a JSON line with "ok": false is printed in both failure cases).
"""

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import json
import re
import sys

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM


def fail(code, summary, msg):
    summary["ok"] = False
    summary["error"] = msg
    print(f"check_hf_export: FAIL: {msg}", file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
    sys.exit(code)


def stored_tensors(d):
    """Names in the checkpoint files from_pretrained reads: the shards named by model.safetensors.index.json,
    else model.safetensors (other *.safetensors files in the directory are not part of the checkpoint)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted({os.path.join(d, v) for v in json.load(f)["weight_map"].values()})
    elif os.path.exists(os.path.join(d, "model.safetensors")):
        files = [os.path.join(d, "model.safetensors")]
    else:
        return None
    out = {}
    for fn in files:
        with safe_open(fn, "pt") as f:
            for k in f.keys():
                out[k] = fn
    return out


def short(names, n=8):
    names = sorted(names)
    return names if len(names) <= n else names[:n] + [f"... ({len(names) - n} more)"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_dir")
    ap.add_argument("--logits", help="safetensors file with input_ids [B,S] and logits [B,S,V] to compare")
    ap.add_argument("--atol", type=float, default=1e-4, help="max allowed |ours - HF| (default 1e-4)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    summary = {"ok": False, "dir": args.export_dir, "transformers": transformers.__version__,
               "torch": torch.__version__}
    if not os.path.isfile(os.path.join(args.export_dir, "config.json")):
        fail(2, summary, f"{args.export_dir}/config.json not found")

    try:
        config = AutoConfig.from_pretrained(args.export_dir)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        summary["model_type"] = config.model_type
        summary["tie_word_embeddings"] = tied
        model, info = AutoModelForCausalLM.from_pretrained(
            args.export_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - any loading failure is a check failure
        fail(2, summary, f"from_pretrained raised {type(e).__name__}: {e}")
    model.eval()

    allowed_missing = {"lm_head.weight"} if tied else set()
    report = {k: sorted(str(x) for x in v) for k, v in info.items()}
    missing = [k for k in report.get("missing_keys", []) if k not in allowed_missing]
    problems = {}
    if missing:
        problems["missing_keys"] = missing
    for k in ("unexpected_keys", "mismatched_keys", "error_msgs"):
        if report.get(k):
            problems[k] = report[k]
    summary["loading_report"] = report
    if problems:
        fail(2, summary, f"loading report not clean: {json.dumps(problems)}")

    # Our own look at the stored names (catches what HF might ignore silently).
    stored = stored_tensors(args.export_dir)
    if stored is None:
        fail(2, summary, "neither model.safetensors nor model.safetensors.index.json in the directory")
    params = dict(model.named_parameters(remove_duplicate=False))
    # Qwen3-MoE: the on-disk per-expert keys (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight)
    # load into the fused in-memory experts.gate_up_proj / experts.down_proj (qwen3-hf.md §2); every
    # expert of every fused parameter must be stored.
    fused, names = {}, set()
    for k in stored:
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", k)
        if m:
            name = m.group(1) + (".down_proj" if m.group(3) == "down" else ".gate_up_proj")
            fused.setdefault(name, set()).add((int(m.group(2)), m.group(3)))
            names.add(name)
        else:
            names.add(k)
    for name, got in fused.items():
        if name not in params:
            fail(2, summary, f"stored experts for {name}, which the model does not have")
        n_exp = params[name].shape[0]
        parts = ("down",) if name.endswith("down_proj") else ("gate", "up")
        lacking = [(e, p) for e in range(n_exp) for p in parts if (e, p) not in got]
        if lacking:
            fail(2, summary, f"{name}: experts not stored: {short([f'{e}.{p}_proj' for e, p in lacking])}")
    extra = sorted(k for k in names if k not in params)
    if extra:
        fail(2, summary, f"stored tensors that are not model parameters: {short(extra)}")
    absent = sorted(k for k in params if k not in names and not (tied and k == "lm_head.weight"))
    if absent:
        fail(2, summary, f"model parameters not stored: {short(absent)}")
    if tied:
        if model.lm_head.weight is not model.model.embed_tokens.weight:
            fail(2, summary, "config says tie_word_embeddings but HF did not tie lm_head to embed_tokens "
                             "(stored lm_head.weight differs from model.embed_tokens.weight?)")
    summary["n_stored_tensors"] = len(stored)
    summary["n_params"] = sum(p.numel() for p in model.parameters())

    if args.logits:
        with safe_open(args.logits, "pt") as f:
            names = set(f.keys())
            for k in ("input_ids", "logits"):
                if k not in names:
                    fail(2, summary, f"{args.logits} has no tensor '{k}'")
            input_ids = f.get_tensor("input_ids").to(torch.int64)
            ours = f.get_tensor("logits").to(torch.float32)
        if input_ids.dim() != 2:
            fail(2, summary, f"input_ids must be [B,S], got {list(input_ids.shape)}")
        B, S = input_ids.shape
        V = config.vocab_size
        if list(ours.shape) != [B, S, V]:
            fail(2, summary, f"logits shape {list(ours.shape)} != [B,S,V] = {[B, S, V]}")
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= V:
            fail(2, summary, "input_ids out of range [0, vocab_size)")
        position_ids = torch.arange(S, dtype=torch.int64).unsqueeze(0)
        with torch.no_grad():
            ref = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None,
                        use_cache=False).logits.float()
        diff = (ours - ref).abs()
        max_diff = float(diff.max())
        summary.update(batch=B, seq=S, vocab=V, atol=args.atol, max_abs_diff=max_diff,
                       max_abs_ref=float(ref.abs().max()), argmax_agree=float((ours.argmax(-1) == ref.argmax(-1)).float().mean()))
        print(f"check_hf_export: max |ours - HF| = {max_diff:.3e} (atol {args.atol:g})", file=sys.stderr)
        if not (max_diff <= args.atol):  # also catches NaN
            where = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0]) if torch.isfinite(diff).all() else None
            summary["worst_index"] = where
            fail(1, summary, f"logits differ: max abs diff {max_diff:.3e} > atol {args.atol:g}")

    summary["ok"] = True
    summary.pop("loading_report", None)
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
