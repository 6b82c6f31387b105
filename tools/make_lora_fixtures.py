#!/usr/bin/env python3
"""Reference numbers for titan's LoRA adapters from the REAL PEFT + transformers code.

    .venv/bin/python tools/make_lora_fixtures.py --out tests/fixtures/lora

For each base model NAME of tests/fixtures/hf (made by tools/make_hf_fixtures.py), a fixture
tests/fixtures/lora/NAME/ holds
  adapter_config.json, adapter_model.safetensors   PeftModel.save_pretrained of a LoRA adapter
      (get_peft_model with LoraConfig(r=4, lora_alpha=8, all seven projections -- the attention's four
      for MoE --, lora_dropout=0);
      its A and B are then redrawn ~ N(0, ADAPTER_STD) so that the adapters change the logits: PEFT's
      own init has B = 0)
  expected.safetensors  on the batch of the base fixture's expected.safetensors (input_ids, labels):
      logits  f32 [B,S,V]   the adapted model's fp32 logits (eager attention)
      loss    f32 []        HF's causal-LM loss (mean CE over the non-ignored shifted labels)
      grad.<adapter key>    d loss / d adapter weight, under adapter_model.safetensors' key names
      base_logits f32 [B,S,V]  the base model's logits (the adapters do matter: they differ)
      greedy_prompt, greedy_generated  int64: PeftModel.generate(do_sample=False) of 12 new tokens from
                            the first 5 tokens of row 0 (no EOS)
Deterministic: fixed seeds, one thread, CPU.
"""

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json

import peft
import safetensors.torch
import torch
import transformers

NAMES = ["tied_gqa2", "untied_gqa4", "moe_nonorm_dense1"]
RANK, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTER_STD = 0.1
SEED = 20261202


def make(name, hf_root, out_root):
    base_dir = os.path.join(hf_root, name)
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    exp = safetensors.torch.load_file(os.path.join(base_dir, "expected.safetensors"))
    ids, labels = exp["input_ids"], exp["labels"]
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits.float()
    # MoE: attention only. PEFT (with transformers 5) reads gate_proj/up_proj/down_proj of a
    # Qwen3-MoE model as its fused expert parameters, which titan does not adapt.
    moe = model.config.model_type == "qwen3_moe"
    targets = TARGETS[:4] if moe else TARGETS
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0,
                          bias="none", task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(ADAPTER_STD * torch.randn(p.shape, generator=g))
    fdir = os.path.join(out_root, name)
    os.makedirs(fdir, exist_ok=True)
    pm.save_pretrained(fdir)
    cpath = os.path.join(fdir, "adapter_config.json")
    with open(cpath) as f:
        saved_cfg = json.load(f)
    saved_cfg["target_modules"] = sorted(saved_cfg["target_modules"])  # a set: stable order on disk
    with open(cpath, "w") as f:
        json.dump(saved_cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    out = pm(input_ids=ids, labels=labels)
    out.loss.backward()
    tensors = {"logits": out.logits.detach().float().contiguous(),
               "loss": out.loss.detach().float().reshape(()),
               "base_logits": base_logits.contiguous()}
    # Greedy generation with the adapters (titan generate --lora.adapter_path): 12 new tokens from
    # the first 5 tokens of row 0.
    pm.eval()
    with torch.no_grad():
        prompt = ids[:1, :5]
        gen = pm.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    tensors["greedy_prompt"] = prompt[0].contiguous()
    tensors["greedy_generated"] = gen[0, 5:].contiguous()
    saved = set(safetensors.torch.load_file(os.path.join(fdir, "adapter_model.safetensors")))
    for n, p in pm.named_parameters():
        if "lora_" not in n:
            assert p.grad is None, n  # the base is frozen
            continue
        key = n.replace(".default", "")
        assert key in saved, (key, sorted(saved)[:3])
        tensors["grad." + key] = p.grad.detach().float().contiguous()
    assert sum(k.startswith("grad.") for k in tensors) == len(saved)
    assert len(tensors["greedy_generated"]) == 12
    meta = {"format": "pt", "peft": peft.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__, "r": str(RANK), "lora_alpha": str(ALPHA)}
    safetensors.torch.save_file(tensors, os.path.join(fdir, "expected.safetensors"), metadata=meta)
    readme = os.path.join(fdir, "README.md")
    if os.path.exists(readme):
        os.remove(readme)  # save_pretrained's model card: not needed
    print(f"{name}: {len(saved)} adapter tensors, loss {out.loss.item():.6f}, "
          f"max |logits - base| {float((out.logits - base_logits).abs().max()):.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", default="tests/fixtures/hf")
    ap.add_argument("--out", default="tests/fixtures/lora")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    for n in NAMES:
        make(n, a.hf, a.out)
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("LoRA parity fixtures made by tools/make_lora_fixtures.py (its docstring says what each "
                "file holds) with peft %s, transformers %s, torch %s.\n"
                % (peft.__version__, transformers.__version__, torch.__version__))


if __name__ == "__main__":
    main()
