#!/usr/bin/env python3
"""Build tiny random Hugging Face Qwen3 / Qwen3-MoE models plus reference numbers for titan.cpp parity tests.

    .venv/bin/python tools/make_hf_fixtures.py --out tests/fixtures/hf

Each fixture tests/fixtures/hf/NAME/ holds
  config.json, generation_config.json, model.safetensors   model.save_pretrained(dir, safe_serialization=True)
  expected.safetensors                                       reference numbers from the REAL transformers code:
      input_ids  int64 [B,S]        random in [0, V)
      labels     int64 [B,S]        input_ids with 3 positions set to -100 (HF convention: UNSHIFTED;
                                    the loss at position t uses labels[t+1]; labels[:,0] is never used)
      logits     f32   [B,S,V]      forward(input_ids, labels, position_ids=arange(S), attention_mask=None,
                                    use_cache=False), attn_implementation="eager", fp32
      loss       f32   []           HF ForCausalLMLoss (mean CE over non-ignored shifted labels)
      grad.<name>  f32              d loss / d param, for every model.named_parameters() entry (tied models:
                                    lm_head.weight IS model.embed_tokens.weight, recorded once under that name)
      adamw.<name> f32              the parameter after ONE torch.optim.AdamW step on those gradients, no clipping
See tests/fixtures/hf/README.md (written by this script) for details.

Deterministic: fixed seeds, torch.use_deterministic_algorithms(True), one thread, CPU. Rerunning gives
bitwise-identical files (with the same torch/transformers versions).
"""

import os

# Single-threaded and light: set before torch is imported.
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import json
import shutil
import sys

import safetensors
import safetensors.torch
import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

B, S = 2, 16
SEED_BASE = 20240817
WEIGHT_STD = 0.2          # target std of Linear / Embedding weights (HF init gives initializer_range = 0.02)
NORM_JITTER = 0.1         # RMSNorm weights = 1 + NORM_JITTER * randn
IGNORED_POSITIONS = [(0, 5), (0, 9), (1, 7)]   # (row, col) of labels set to -100
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

COMMON = dict(
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    attention_bias=False,
    use_sliding_window=False,
    initializer_range=0.02,
    hidden_act="silu",
    attention_dropout=0.0,
)

FIXTURES = [
    ("tied_gqa2", dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=64, tie_word_embeddings=True)),
    ("untied_gqa1", dict(vocab_size=1000, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=16, intermediate_size=64, tie_word_embeddings=False)),
    ("untied_gqa4", dict(vocab_size=1024, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=8, intermediate_size=96, tie_word_embeddings=False)),
    ("tied_hd_eq", dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True)),
]


# Qwen3-MoE fixtures (Qwen3MoeForCausalLM). The auxiliary loss is on (output_router_logits) with a large
# coefficient so its gradient is visible; one fixture keeps a dense layer through mlp_only_layers.
MOE_COMMON = dict(vocab_size=1000, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=64, moe_intermediate_size=24, decoder_sparse_step=1)
MOE_FIXTURES = [
    ("moe_norm", dict(MOE_COMMON, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.05,
                      tie_word_embeddings=False)),
    ("moe_nonorm_dense1", dict(MOE_COMMON, num_hidden_layers=3, num_experts=6, num_experts_per_tok=3,
                               norm_topk_prob=False, mlp_only_layers=[1], output_router_logits=True,
                               router_aux_loss_coef=0.05, tie_word_embeddings=True)),
    ("moe_noaux", dict(MOE_COMMON, num_hidden_layers=2, num_experts=4, num_experts_per_tok=1, norm_topk_prob=True,
                       mlp_only_layers=[], output_router_logits=False, tie_word_embeddings=False)),
]
TOPK_MARGIN = 1e-4   # every token's k-th and (k+1)-th router probabilities differ by more than this


def versions():
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
    }


def rescale_weights(model):
    """Linear / Embedding weights x (WEIGHT_STD / initializer_range); RMSNorm weights =
    1 + NORM_JITTER * randn. Each *parameter* is touched once (a tied lm_head shares
    embed_tokens' parameter)."""
    scale = WEIGHT_STD / model.config.initializer_range
    done = set()
    with torch.no_grad():
        for mname, module in model.named_modules():
            w = getattr(module, "weight", None)
            if not isinstance(w, torch.nn.Parameter) or id(w) in done:
                continue
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                w.mul_(scale)
            elif "RMSNorm" in type(module).__name__:
                w.copy_(1.0 + NORM_JITTER * torch.randn(w.shape, dtype=w.dtype))
            else:
                raise RuntimeError(f"unexpected module with weight: {mname} ({type(module).__name__})")
            done.add(id(w))
    n_named = len(list(model.parameters()))
    assert len(done) == n_named, (len(done), n_named)


def build_model(spec, seed):
    torch.manual_seed(seed)
    config = Qwen3Config(**spec, **COMMON, dtype="float32", attn_implementation="eager")
    model = Qwen3ForCausalLM(config)          # HF init (post_init): Normal(0, 0.02), RMSNorm weights = 1
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    model = model.to(torch.float32)

    rescale_weights(model)
    if spec["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "expected tied lm_head"
    else:
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    return model


def build_moe_model(spec, seed):
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(**spec, **COMMON, dtype="float32", attn_implementation="eager")
    model = Qwen3MoeForCausalLM(config)
    model.set_attn_implementation("eager")
    model = model.to(torch.float32)
    # As build_model: matrices (Linear, Embedding, router, stacked experts) x10 (std 0.2); 1-D RMSNorm
    # weights = 1 + 0.1 * randn. parameters() lists a tied weight once.
    scale = WEIGHT_STD / config.initializer_range
    with torch.no_grad():
        for n, w in model.named_parameters():
            if w.dim() >= 2:
                w.mul_(scale)
            elif n.endswith("norm.weight"):
                w.copy_(1.0 + NORM_JITTER * torch.randn(w.shape, dtype=w.dtype))
            else:
                raise RuntimeError(f"unexpected parameter {n}")
    return model


def per_expert(name, t, spec):
    """HF in-memory fused expert tensors -> the per-expert on-disk keys (qwen3-hf.md §2)."""
    im = spec["moe_intermediate_size"]
    pre = name.rsplit(".", 1)[0]   # model.layers.N.mlp.experts
    out = {}
    for e in range(t.shape[0]):
        if name.endswith("gate_up_proj"):
            out[f"{pre}.{e}.gate_proj.weight"] = t[e, :im].contiguous()
            out[f"{pre}.{e}.up_proj.weight"] = t[e, im:].contiguous()
        else:
            out[f"{pre}.{e}.down_proj.weight"] = t[e].contiguous()
    return out


def disk_tensors(named, spec, fn):
    """{on-disk key: fn(param)} with the fused experts split per expert."""
    out = {}
    for n, p in named:
        t = fn(p)
        if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
            out.update(per_expert(n, t, spec))
        else:
            out[n] = t.contiguous()
    return out


def make_moe_fixture(name, spec, idx, out_root):
    seed = SEED_BASE + 7000 + 1000 * idx
    for attempt in range(50):
        model = build_moe_model(spec, seed + 100 * attempt)
        input_ids, labels = make_batch(spec["vocab_size"], seed + 100 * attempt + 1)
        position_ids = torch.arange(S, dtype=torch.int64).unsqueeze(0)
        model.train()
        with torch.no_grad():
            probe = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False,
                          output_router_logits=True)
        # Top-k selection must not hinge on rounding: every token's k-th and (k+1)-th probabilities
        # differ by more than TOPK_MARGIN in every sparse layer (titan's fp32 probabilities differ from
        # these by ~1e-7), so tie-breaking never decides the fixture.
        k, margin = spec["num_experts_per_tok"], float("inf")
        for z in probe.router_logits:
            p = torch.softmax(z.detach().float(), dim=-1).sort(dim=-1, descending=True).values
            if k < p.shape[-1]:
                margin = min(margin, (p[:, k - 1] - p[:, k]).min().item())
        if margin > TOPK_MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed gives a top-k margin above {TOPK_MARGIN}")
    seed = seed + 100 * attempt
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=None,
                use_cache=False)   # output_router_logits as the config says
    tied = spec["tie_word_embeddings"]
    fdir = os.path.join(out_root, name)
    if os.path.isdir(fdir):
        shutil.rmtree(fdir)
    os.makedirs(fdir)
    model.save_pretrained(fdir, safe_serialization=True)   # per-expert keys (save_original_format=True)
    from safetensors import safe_open
    with safe_open(os.path.join(fdir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    named = list(model.named_parameters())
    want = set(disk_tensors(named, spec, lambda p: p.detach()).keys())
    assert keys == want, sorted(keys ^ want)

    logits = out.logits.detach().clone()
    loss = out.loss
    aux = out.aux_loss.detach().clone() if out.aux_loss is not None else torch.tensor(0.0)
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), shift.reshape(-1),
                                           ignore_index=-100, reduction="mean")
    if spec["output_router_logits"]:
        expect = ce + spec["router_aux_loss_coef"] * aux
    else:
        expect = ce
    assert torch.allclose(expect, loss.detach(), rtol=1e-6, atol=1e-6), (expect.item(), loss.item())
    loss.backward()
    tensors = {"input_ids": input_ids.contiguous(), "labels": labels.contiguous(), "logits": logits.contiguous(),
               "loss": loss.detach().clone().contiguous(), "ce_loss": ce.detach().clone().contiguous(),
               "aux_loss": aux.float().contiguous()}
    for key, g in disk_tensors(named, spec, lambda p: p.grad.detach().clone()).items():
        assert torch.isfinite(g).all(), key
        tensors["grad." + key] = g
    opt = torch.optim.AdamW([p for _, p in named], lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False, fused=False)
    opt.step()
    for key, w in disk_tensors(named, spec, lambda p: p.detach().clone()).items():
        tensors["adamw." + key] = w
    v = versions()
    metadata = {"format": "pt", "fixture": name, "seed": str(seed), "batch_size": str(B), "seq_len": str(S),
                "attn_implementation": "eager", "dtype": "float32", "topk_margin": repr(margin),
                "loss": "CE mean + router_aux_loss_coef * aux_loss (when output_router_logits)",
                "names": "grad./adamw. use the on-disk per-expert keys (fused in-memory tensors split)",
                "torch_version": v["torch"], "transformers_version": v["transformers"]}
    exp_path = os.path.join(fdir, "expected.safetensors")
    safetensors.torch.save_file(tensors, exp_path, metadata=metadata)
    canonicalize_header(exp_path)
    # The fused layout (save_original_format=False) of the same weights, for the reader's other path.
    if name == "moe_norm":
        fused_dir = os.path.join(out_root, name + "_fused")
        if os.path.isdir(fused_dir):
            shutil.rmtree(fused_dir)
        re_model = Qwen3MoeForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager")
        re_model.save_pretrained(fused_dir, safe_serialization=True, save_original_format=False)
        with safe_open(os.path.join(fused_dir, "model.safetensors"), "pt") as f:
            assert any(k.endswith("experts.gate_up_proj") for k in f.keys()), sorted(f.keys())
    # Round trip through from_pretrained reproduces the logits.
    re, info = Qwen3MoeForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager",
                                                   output_loading_info=True)
    bad = {k: sorted(map(str, v)) for k, v in info.items()
           if v and not (k == "missing_keys" and set(v) <= {"lm_head.weight"})}
    assert not bad, bad
    with torch.no_grad():
        relog = re(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    assert (relog - logits).abs().max().item() < 1e-5
    print(f"{name:18s} seed={seed} loss={loss.item():.6f} aux={aux.item():.6f} top-k margin={margin:.3g} "
          f"tensors={len(tensors)}")


def make_batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (B, S), generator=g, dtype=torch.int64)
    labels = input_ids.clone()
    for r, c in IGNORED_POSITIONS:
        labels[r, c] = -100
    return input_ids, labels


def check_saved_keys(path, model, tied):
    from safetensors import safe_open
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        meta = f.metadata()
    assert meta.get("format") == "pt", meta
    names = {n for n, _ in model.named_parameters()}
    if tied:
        assert "lm_head.weight" not in keys, "tied model saved an lm_head.weight"
    else:
        assert "lm_head.weight" in keys
    assert keys == names, (sorted(keys ^ names))
    return keys


def canonicalize_header(path):
    """Sort the __metadata__ keys in a safetensors header, in place.

    safetensors (Rust) keeps metadata in a HashMap whose iteration order is randomized per process, so two
    identical save_file calls give files that differ in header byte order. Rewriting the header with the
    metadata keys sorted (same JSON, same length, same padding) makes the file bitwise reproducible; the
    data section is untouched.
    """
    import struct
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header_bytes = raw[8:8 + n]
    header = json.loads(header_bytes, object_pairs_hook=lambda pairs: dict(pairs))
    meta = header.pop("__metadata__", None)
    out = {}
    if meta is not None:
        out["__metadata__"] = {k: meta[k] for k in sorted(meta)}
    out.update(header)  # tensor entries keep the writer's order
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(text) == len(header_bytes.rstrip(b" ")), (len(text), len(header_bytes.rstrip(b" ")))
    text = text + b" " * (n - len(text))
    assert json.loads(text) == json.loads(header_bytes)
    with open(path, "wb") as f:
        f.write(raw[:8] + text + raw[8 + n:])


def make_fixture(name, spec, idx, out_root):
    seed = SEED_BASE + 1000 * idx
    tied = spec["tie_word_embeddings"]
    model = build_model(spec, seed)
    model.train()  # dropout is 0.0 everywhere; mode does not change the numbers

    fdir = os.path.join(out_root, name)
    if os.path.isdir(fdir):
        shutil.rmtree(fdir)
    os.makedirs(fdir)
    model.save_pretrained(fdir, safe_serialization=True)
    check_saved_keys(fdir, model, tied)

    input_ids, labels = make_batch(spec["vocab_size"], seed + 1)
    position_ids = torch.arange(S, dtype=torch.int64).unsqueeze(0)

    named = list(model.named_parameters())  # deduplicated: tied lm_head appears only as model.embed_tokens.weight
    if tied:
        assert "lm_head.weight" not in dict(named)

    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=None,
                use_cache=False)
    logits = out.logits.detach().clone()
    loss = out.loss
    assert logits.dtype == torch.float32 and logits.shape == (B, S, spec["vocab_size"])
    assert loss.dtype == torch.float32 and loss.shape == ()

    # Independent check of the HF loss: position t predicts labels[t+1], mean over non-ignored.
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), shift.reshape(-1),
                                            ignore_index=-100, reduction="mean")
    assert torch.allclose(ref, loss.detach(), rtol=1e-6, atol=1e-6), (ref.item(), loss.item())

    loss.backward()
    tensors = {
        "input_ids": input_ids.contiguous(),
        "labels": labels.contiguous(),
        "logits": logits.contiguous(),
        "loss": loss.detach().clone().contiguous(),
    }
    for n, p in named:
        assert p.grad is not None, f"no grad for {n}"
        assert torch.isfinite(p.grad).all(), n
        tensors["grad." + n] = p.grad.detach().clone().contiguous()

    before = {n: p.detach().clone() for n, p in named}
    opt = torch.optim.AdamW([p for _, p in named], lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], amsgrad=False, maximize=False,
                            foreach=False, fused=False, capturable=False, differentiable=False)
    opt.step()
    lr, (b1, b2), eps, wd = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
    for n, p in named:
        tensors["adamw." + n] = p.detach().clone().contiguous()
        # Independent check of the first AdamW step (bias-corrected m_hat = g, v_hat = g^2).
        g = p.grad.double()
        m_hat = (1 - b1) * g / (1 - b1)
        v_hat = (1 - b2) * g * g / (1 - b2)
        manual = before[n].double() * (1 - lr * wd) - lr * m_hat / (v_hat.sqrt() + eps)
        assert torch.allclose(manual, p.detach().double(), rtol=0, atol=1e-6), n

    v = versions()
    metadata = {
        "format": "pt",
        "fixture": name,
        "seed": str(seed),
        "batch_size": str(B),
        "seq_len": str(S),
        "attn_implementation": "eager",
        "dtype": "float32",
        "use_cache": "False",
        "position_ids": "arange(seq_len) for every row (no packing)",
        "attention_mask": "None (causal only)",
        "labels": "HF convention, unshifted: loss at position t uses labels[t+1]; -100 ignored; last position ignored",
        "loss_reduction": "mean over non-ignored shifted labels (num_items_in_batch=None)",
        "tie_word_embeddings": str(tied).lower(),
        "adamw_lr": repr(ADAMW["lr"]),
        "adamw_betas": json.dumps(list(ADAMW["betas"])),
        "adamw_beta1": repr(ADAMW["betas"][0]),
        "adamw_beta2": repr(ADAMW["betas"][1]),
        "adamw_eps": repr(ADAMW["eps"]),
        "adamw_weight_decay": repr(ADAMW["weight_decay"]),
        "adamw_notes": "torch.optim.AdamW, one step (step=1, bias-corrected), foreach=False, fused=False, "
                       "amsgrad=False, weight decay applied to every parameter (decoupled: p *= 1 - lr*wd), "
                       "no gradient clipping, initial state zero",
        "weight_init": f"HF init (initializer_range 0.02) then Linear/Embedding weights x{WEIGHT_STD / 0.02:g} "
                       f"(std {WEIGHT_STD}); RMSNorm weights = 1 + {NORM_JITTER} * randn",
        "torch_version": v["torch"],
        "transformers_version": v["transformers"],
        "safetensors_version": v["safetensors"],
    }
    exp_path = os.path.join(fdir, "expected.safetensors")
    safetensors.torch.save_file(tensors, exp_path, metadata=metadata)
    canonicalize_header(exp_path)
    back = safetensors.torch.load_file(exp_path)
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)

    # Round trip: the saved checkpoint, loaded by from_pretrained, reproduces the logits exactly.
    re, info = Qwen3ForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager",
                                                output_loading_info=True)
    bad = {k: sorted(map(str, v)) for k, v in info.items() if v and not (k == "missing_keys" and set(v) <= {"lm_head.weight"})}
    assert not bad, bad
    with torch.no_grad():
        relog = re(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    rt_diff = (relog - logits).abs().max().item()
    assert rt_diff == 0.0, f"round-trip logits differ by {rt_diff}"

    n_params = sum(p.numel() for _, p in named)
    sizes = {f: os.path.getsize(os.path.join(fdir, f)) for f in sorted(os.listdir(fdir))}
    return {
        "name": name,
        "params": n_params,
        "loss": loss.item(),
        "logit_std": logits.std().item(),
        "grad_abs_max": max(p.grad.abs().max().item() for _, p in named),
        "grad_abs_min_nonzero_mean": min(p.grad.abs().mean().item() for _, p in named),
        "sizes": sizes,
        "total_bytes": sum(sizes.values()),
        "n_tensors": len(tensors),
    }


README = """# Hugging Face Qwen3 reference fixtures

Tiny random `transformers.Qwen3ForCausalLM` models and reference numbers computed by the real
Hugging Face transformers code, for titan.cpp parity tests. Generated by

    .venv/bin/python tools/make_hf_fixtures.py --out tests/fixtures/hf

with python {python}, torch {torch}, transformers {transformers}, safetensors {safetensors}
(versions read at generation time). The script is deterministic (fixed seeds,
`torch.use_deterministic_algorithms(True)`, one thread, CPU): rerunning it with the same versions gives
bitwise-identical files.

## Models

All: fp32, `rope_parameters = {{"rope_type": "default", "rope_theta": 1e6}}`, rms_norm_eps 1e-6,
max_position_embeddings 128, attention_bias false, use_sliding_window false, silu, no dropout.
Weights: HF's own init (initializer_range 0.02, seeded), then every Linear and Embedding weight multiplied by
10 (std 0.2) and every RMSNorm weight (input/post-attention/final norm, q_norm, k_norm) set to
1 + 0.1·randn, so logits and gradients are far above fp32 rounding noise.

| fixture | V | H | L | nh | nkv | head_dim | I | tied | params | loss |
|---|---|---|---|---|---|---|---|---|---|---|
{table}

## Files in each directory

- `config.json`, `generation_config.json`, `model.safetensors`: `model.save_pretrained(dir, safe_serialization=True)`.
  Tied models have no `lm_head.weight` in `model.safetensors` (checked by the script); untied models have it.
- `expected.safetensors` (metadata holds the settings below as strings, `"format": "pt"`), for one batch
  B=2, S=16, `attn_implementation="eager"`, fp32, `use_cache=False`, `position_ids = arange(S)` (no packing),
  `attention_mask=None` (plain causal):
  - `input_ids` int64 [B,S], uniform in [0, V).
  - `labels` int64 [B,S]: `input_ids` with positions (0,5), (0,9), (1,7) set to -100.
  - `logits` float32 [B,S,V]: the forward with labels.
  - `loss` float32 scalar (shape []): HF `ForCausalLMLoss`, i.e. mean cross-entropy over the non-ignored
    shifted labels (`num_items_in_batch=None`).
  - `grad.<name>` float32, one per `model.named_parameters()` entry (HF names, e.g.
    `grad.model.layers.0.self_attn.q_proj.weight`). In tied models `lm_head.weight` and
    `model.embed_tokens.weight` are one parameter; its gradient (embedding + head contributions) is stored
    once, as `grad.model.embed_tokens.weight`.
  - `adamw.<name>` float32: the parameter after exactly one `torch.optim.AdamW` step on those gradients,
    lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 (decoupled, applied to every parameter including
    norms and embeddings), foreach=False, fused=False, **no gradient clipping**, fresh optimizer state.
    Metadata keys `adamw_lr`, `adamw_betas`, `adamw_beta1`, `adamw_beta2`, `adamw_eps`, `adamw_weight_decay`.

## Label convention

`labels` are in the Hugging Face convention: **unshifted**, same positions as `input_ids`. HF shifts
internally: the logits at position t are scored against `labels[t+1]`; the last position (and every
-100) is ignored, and `labels[:, 0]` is never used. A consumer that trains "position t predicts token
t+1" should use `target[t] = labels[t+1]` for t < S-1 and ignore t = S-1. With the -100s above, each
batch has 2·15 − 3 = 27 scored positions and `loss` is the mean over those 27.

## Checking an exported model

`tools/check_hf_export.py DIR [--logits OURS.safetensors] [--atol 1e-4]` loads an exported directory with
`AutoModelForCausalLM.from_pretrained` and fails on any missing/unexpected/mismatched key (a missing
`lm_head.weight` is allowed only for tied models), then optionally compares HF's logits on `input_ids`
with ours. Sanity check on a fixture (max diff 0):

    .venv/bin/python tools/check_hf_export.py tests/fixtures/hf/tied_gqa2 --logits tests/fixtures/hf/tied_gqa2/expected.safetensors

## Qwen3-MoE fixtures (`Qwen3MoeForCausalLM`)

`moe_norm` (8 experts, top-2, norm_topk_prob, untied), `moe_nonorm_dense1` (6 experts, top-3, no
renormalisation, layer 1 dense through `mlp_only_layers`, tied) and `moe_noaux` (4 experts, top-1, aux loss
off): V 1000, H 32, 4/2 heads, head_dim 16, intermediate 64, moe_intermediate 24. The first two set
`output_router_logits` with `router_aux_loss_coef` 0.05, so `loss` = CE + 0.05·aux (`ce_loss` and
`aux_loss` are stored too). `grad.*` and `adamw.*` use the on-disk per-expert keys
(`model.layers.N.mlp.experts.E.{{gate,up,down}}_proj.weight`): the in-memory fused `gate_up_proj` /
`down_proj` tensors are split per expert. `moe_norm_fused` holds the same weights saved with
`save_original_format=False` (fused keys). Seeds are chosen so that in every sparse layer each token's
k-th and (k+1)-th router probabilities differ by more than 1e-4 (metadata `topk_margin`): the
selection never depends on how ties or near-ties are broken.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/hf", help="output root (default tests/fixtures/hf)")
    ap.add_argument("--only", nargs="*", help="build only these fixtures")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    os.makedirs(args.out, exist_ok=True)
    v = versions()
    print(f"torch {v['torch']}, transformers {v['transformers']}, safetensors {v['safetensors']}")
    rows, results = [], []
    for idx, (name, spec) in enumerate(FIXTURES):
        if args.only and name not in args.only:
            continue
        r = make_fixture(name, spec, idx, args.out)
        results.append(r)
        print(f"{name:12s} params={r['params']:7d} loss={r['loss']:.6f} logit_std={r['logit_std']:.3f} "
              f"|grad|max={r['grad_abs_max']:.3e} min(mean|grad|)={r['grad_abs_min_nonzero_mean']:.3e} "
              f"tensors={r['n_tensors']} bytes={r['total_bytes']} "
              + " ".join(f"{k}={s}" for k, s in r["sizes"].items()))
        rows.append(f"| `{name}` | {spec['vocab_size']} | {spec['hidden_size']} | {spec['num_hidden_layers']} | "
                    f"{spec['num_attention_heads']} | {spec['num_key_value_heads']} | {spec['head_dim']} | "
                    f"{spec['intermediate_size']} | {str(spec['tie_word_embeddings']).lower()} | {r['params']} | "
                    f"{r['loss']:.6f} |")
    for idx, (name, spec) in enumerate(MOE_FIXTURES):
        if args.only and name not in args.only:
            continue
        make_moe_fixture(name, spec, idx, args.out)
    if not args.only:
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(README.format(table="\n".join(rows), **v))
    total = sum(r["total_bytes"] for r in results)
    print(f"total {total} bytes ({total / 2**20:.2f} MiB) in {len(results)} fixtures under {args.out}")


if __name__ == "__main__":
    main()
