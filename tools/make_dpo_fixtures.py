#!/usr/bin/env python3
"""Reference fixtures for DPO (Direct Preference Optimization) made by the REAL Hugging Face TRL
DPOTrainer (tools venv, pinned in tools/requirements.txt):

    .venv/bin/python tools/make_dpo_fixtures.py [--assets DIR] [--out tests/fixtures/dpo]

tokenize.json   preference records in every format TRL's DPOTrainer reads, each with what TRL makes of it
                with the Qwen3 tokenizer (<assets>/tokenizers/qwen3, eos_token "<|im_end|>" = 151645):
                one DPOTrainer(train_dataset=Dataset.from_list([record])) per record, and its
                trainer.train_dataset[0] read back (TRL's own _prepare_dataset: extract_prompt when there is no
                "prompt", EOS text appended to plain-text chosen/rejected, tokenize_fn, the max_length filter;
                default DPOConfig: max_length 1024, truncation_mode keep_start -- nothing here is truncated).
                Per case: format, record (the input), processed (the prompt/chosen/rejected columns after
                extract_prompt / add_eos), prompt_ids, chosen_ids, rejected_ids (TRL's columns; the model is fed
                prompt_ids + chosen_ids and prompt_ids + rejected_ids, and only the chosen/rejected ids are
                scored), and their decodings (prompt_text, chosen_text, rejected_text; special tokens kept).
loss/policy/, loss/ref/
                config.json, generation_config.json, model.safetensors (save_pretrained, safetensors, fp32):
                a tiny random Qwen3ForCausalLM (V=256, H=32, I=64, L=2, 4 heads, 2 kv heads, head_dim 8, tied
                embeddings, rope_theta 1e4, rms_norm_eps 1e-6, max_position_embeddings 128) with HF's seeded
                init rescaled like tools/make_hf_fixtures.py (Linear/Embedding weights x10 -> std 0.2, RMSNorm
                weights 1 + 0.1 randn) so logits are far above rounding noise. ref = policy + N(0, 0.02^2)
                noise on every parameter (seeded), so policy != reference and the margins are non-zero.
loss/expected.json
                a batch of 4 preference pairs given as token ids (prompt 3-9, chosen/rejected 2-8 tokens, all
                lengths different so padding matters). TRL reads only text datasets in __init__, so the ids go
                through TRL's own DataCollatorForPreference (built as DPOTrainer builds it, but with
                pad_token_id 0: the Qwen3 tokenizer's pad id 151643 is outside the tiny vocab; right padding
                under a causal mask does not change any score) and trainer.compute_loss(trainer.model, batch),
                the function Trainer.training_step calls; eager attention, fp32, CPU.
                - pairs: prompt_input_ids / chosen_input_ids / rejected_input_ids exactly as fed (TRL appends
                  nothing to pre-tokenized ids), the policy's and the reference's chosen/rejected logps (sum
                  over the completion tokens of log p(token), from trainer.compute_ref_log_probs(model, batch),
                  the fused-LM-head path the loss uses; checked against a plain log_softmax of HF logits).
                - batch: the collated input_ids / attention_mask / completion_mask ([chosen rows; rejected
                  rows], right padded).
                - runs: for each loss_type in sigmoid, ipo, hinge, robust (beta 0.1; label_smoothing 0.1 for
                  robust, 0 otherwise): the batch loss and every metric TRL logged for the step
                  (trainer._metrics["train"], TRL's names: rewards/chosen, rewards/margins, logps/chosen,
                  logits/chosen, entropy, mean_token_accuracy, num_tokens, ...).
loss/grads_sigmoid.safetensors, loss/grads_ipo.safetensors
                float32 d loss / d parameter for every policy parameter under its HF name
                (model.named_parameters(): the tied model.embed_tokens.weight holds the embedding's and the
                LM head's gradient together).
Deterministic: fixed seeds, one thread, CPU, torch.use_deterministic_algorithms(True).
"""
import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import json
import math
import shutil
import sys
import tempfile
import warnings

import datasets
import safetensors.torch
import tokenizers
import torch
import torch.nn.functional as F
import transformers
import trl
from datasets import Dataset
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from trl import DPOConfig, DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

from make_hf_fixtures import rescale_weights  # the init of every HF fixture (this directory)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SEED = 20261207
REF_NOISE_STD = 0.02
BETA = 0.1
PAD_ID = 0
RUNS = [("sigmoid", 0.0), ("ipo", 0.0), ("hinge", 0.0), ("robust", 0.1)]
GRAD_RUNS = ("sigmoid", "ipo")
# (prompt, chosen, rejected) lengths of the 4 pairs
LENGTHS = [(3, 2, 6), (9, 8, 2), (5, 5, 8), (7, 3, 4)]

SYS = {"role": "system", "content": "You are a concise assistant."}
RECORDS = [
    ("conversational", {
        "prompt": [SYS, {"role": "user", "content": "What colour is the sky?"}],
        "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "Green, obviously."}]}),
    ("conversational, multi-turn prompt", {
        "prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3?"}],
        "chosen": [{"role": "assistant", "content": "6."}],
        "rejected": [{"role": "assistant", "content": "7, I think."}]}),
    ("conversational, implicit prompt, non-ASCII", {
        "chosen": [{"role": "user", "content": "Ünïcödé ✓ 日本語?"},
                   {"role": "assistant", "content": "Ja: 日本語 ✓ — ça va, naïve café 🙂."}],
        "rejected": [{"role": "user", "content": "Ünïcödé ✓ 日本語?"},
                     {"role": "assistant", "content": "Nein."}]}),
    ("conversational, chat_template_kwargs enable_thinking=false", {
        "prompt": [{"role": "user", "content": "Say hi."}],
        "chosen": [{"role": "assistant", "content": "Hi!"}],
        "rejected": [{"role": "assistant", "content": "No."}],
        "chat_template_kwargs": {"enable_thinking": False}}),
    ("plain text", {
        "prompt": "The capital of France is", "chosen": " Paris.", "rejected": " Lyon, of course."}),
    ("plain text, implicit prompt", {
        "chosen": "The sky is blue.", "rejected": "The sky is green."}),
    ("plain text, prompt ending inside a token", {
        "prompt": "Hello wor", "chosen": "ld!", "rejected": "ld?"}),
]


def quiet_config(out_dir, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DPOConfig(output_dir=out_dir, report_to=[], bf16=False, fp16=False, use_cpu=True,
                         logging_strategy="no", save_strategy="no", seed=SEED, **kw)


def tiny_config():
    return Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                       max_position_embeddings=128,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
                       attention_bias=False, use_sliding_window=False, initializer_range=0.02,
                       hidden_act="silu", attention_dropout=0.0, use_cache=False, dtype="float32",
                       attn_implementation="eager")


def build_models():
    torch.manual_seed(SEED)
    policy = Qwen3ForCausalLM(tiny_config()).to(torch.float32)
    rescale_weights(policy)
    assert policy.lm_head.weight is policy.model.embed_tokens.weight
    ref = Qwen3ForCausalLM(tiny_config()).to(torch.float32)
    ref.load_state_dict(policy.state_dict())
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _, p in ref.named_parameters():
            p.add_(REF_NOISE_STD * torch.randn(p.shape, generator=g))
    return policy, ref


def load(path):
    m = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    assert m.config._attn_implementation == "eager"
    return m


def make_tokenize(tok, out_dir, model_dir):
    cases = []
    for fmt, rec in RECORDS:
        with tempfile.TemporaryDirectory() as tmp:
            args = quiet_config(tmp)
            assert args.max_length == 1024 and args.truncation_mode == "keep_start"
            tr = DPOTrainer(model=load(model_dir), ref_model=load(model_dir), args=args,
                            train_dataset=Dataset.from_list([rec]), processing_class=tok)
            assert len(tr.train_dataset) == 1, fmt
            e = tr.train_dataset[0]
        p, c, r = e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]
        assert len(p) + max(len(c), len(r)) < 1024
        cases.append({
            "format": fmt, "record": rec,
            "processed": {k: e[k] for k in ("prompt", "chosen", "rejected")},
            "prompt_ids": p, "chosen_ids": c, "rejected_ids": r,
            "prompt_text": tok.decode(p, skip_special_tokens=False),
            "chosen_text": tok.decode(c, skip_special_tokens=False),
            "rejected_text": tok.decode(r, skip_special_tokens=False)})
    with open(os.path.join(out_dir, "tokenize.json"), "w") as f:
        json.dump({"generator": "tools/make_dpo_fixtures.py", "trl": trl.__version__,
                   "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                   "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
                   "pad_token": tok.pad_token, "pad_token_id": tok.pad_token_id,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return cases


def make_pairs():
    g = torch.Generator().manual_seed(SEED + 2)
    ids = lambda n: torch.randint(0, 256, (n,), generator=g).tolist()  # noqa: E731
    return [{"prompt_ids": ids(p), "chosen_ids": ids(c), "rejected_ids": ids(r)} for p, c, r in LENGTHS]


def plain_logps(model, batch):
    """Independent check: sum over completion tokens of log_softmax(HF logits)[next token]."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       use_cache=False).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return (lp * batch["completion_mask"][:, 1:]).sum(1).chunk(2)


def run_loss(loss_type, label_smoothing, pairs, loss_dir, tok):
    with tempfile.TemporaryDirectory() as tmp:
        args = quiet_config(tmp, beta=BETA, loss_type=[loss_type], label_smoothing=label_smoothing)
        policy, ref = load(os.path.join(loss_dir, "policy")), load(os.path.join(loss_dir, "ref"))
        # TRL's collator, built as DPOTrainer.__init__ builds it, with a pad id inside the tiny vocab
        collator = DataCollatorForPreference(pad_token_id=PAD_ID, max_length=args.max_length,
                                             truncation_mode=args.truncation_mode,
                                             pad_to_multiple_of=args.pad_to_multiple_of)
        dummy = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])
        tr = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=dummy, processing_class=tok,
                        data_collator=collator)
        assert tr.loss_types == [loss_type] and tr.beta == BETA and tr.label_smoothing == label_smoothing
        assert not tr.precompute_ref_logps and tr.ld_alpha is None and tr.f_divergence_type == "reverse_kl"
        batch = tr.data_collator(pairs)
        tr.model.train()
        tr.model.zero_grad(set_to_none=True)
        loss = tr.compute_loss(tr.model, batch)
        loss.backward()
        metrics = {k: v[-1] for k, v in tr._metrics["train"].items()}
        assert all(len(v) == 1 for v in tr._metrics["train"].values())
        pc, pr = tr.compute_ref_log_probs(tr.model, batch)
        rc, rr = tr.compute_ref_log_probs(tr.ref_model, batch)
        grads = {n: p.grad.detach().float().contiguous().clone() for n, p in tr.model.named_parameters()}
        # checks against an independent computation from the plain HF forward
        qc, qr = plain_logps(tr.model, batch)
        sc, sr = plain_logps(tr.ref_model, batch)
        for a, b in ((pc, qc), (pr, qr), (rc, sc), (rr, sr)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-4), (a, b)
    return batch, float(loss.detach()), metrics, (pc, pr, rc, rr), grads


def check_formula(loss_type, ls, lp, loss, metrics, completion_mask):
    pc, pr, rc, rr = (t.double() for t in lp)
    d = (pc - rc) - (pr - rr)
    if loss_type == "sigmoid":
        want = -F.logsigmoid(BETA * d)
    elif loss_type == "hinge":
        want = torch.relu(1 - BETA * d)
    elif loss_type == "robust":
        want = (-(1 - ls) * F.logsigmoid(BETA * d) + ls * F.logsigmoid(-BETA * d)) / (1 - 2 * ls)
    elif loss_type == "ipo":
        nc, nr = completion_mask.double().sum(1).chunk(2)
        want = ((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * BETA)) ** 2
    assert math.isclose(want.mean().item(), loss, rel_tol=1e-5, abs_tol=1e-6), (loss_type, want.mean(), loss)
    cr, rj = BETA * (pc - rc), BETA * (pr - rr)
    for k, v in {"rewards/chosen": cr.mean(), "rewards/rejected": rj.mean(), "rewards/margins": (cr - rj).mean(),
                 "rewards/accuracies": (cr > rj).double().mean(), "logps/chosen": pc.mean(),
                 "logps/rejected": pr.mean()}.items():
        assert math.isclose(metrics[k], v.item(), rel_tol=1e-5, abs_tol=1e-6), (k, metrics[k], v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", default=os.environ.get("TITAN_ASSETS") or
                    os.path.join(ROOT, "..", "shared", "assets"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "dpo"))
    a = ap.parse_args()
    path = os.path.join(a.assets, "tokenizers", "qwen3")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        sys.exit(f"missing {path}/tokenizer.json (set TITAN_ASSETS or pass --assets)")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.is_fast and tok.eos_token == "<|im_end|>", tok.eos_token

    loss_dir = os.path.join(a.out, "loss")
    for sub in ("policy", "ref"):
        shutil.rmtree(os.path.join(loss_dir, sub), ignore_errors=True)
    os.makedirs(loss_dir, exist_ok=True)
    policy, ref = build_models()
    policy.save_pretrained(os.path.join(loss_dir, "policy"), safe_serialization=True)
    ref.save_pretrained(os.path.join(loss_dir, "ref"), safe_serialization=True)
    for sub in ("policy", "ref"):
        keys = set(safetensors.torch.load_file(os.path.join(loss_dir, sub, "model.safetensors")))
        assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys, sub

    cases = make_tokenize(tok, a.out, os.path.join(loss_dir, "policy"))

    pairs = make_pairs()
    runs, first = [], None
    for loss_type, ls in RUNS:
        batch, loss, metrics, lp, grads = run_loss(loss_type, ls, pairs, loss_dir, tok)
        check_formula(loss_type, ls, lp, loss, metrics, batch["completion_mask"][:, 1:])
        if first is None:
            first = (batch, lp)
        else:
            for x, y in zip(lp, first[1]):
                assert torch.equal(x, y), loss_type
        runs.append({"loss_type": loss_type, "beta": BETA, "label_smoothing": ls, "loss": loss,
                     "metrics": metrics})
        if loss_type in GRAD_RUNS:
            safetensors.torch.save_file(grads, os.path.join(loss_dir, f"grads_{loss_type}.safetensors"),
                                        metadata={"format": "pt"})
        print(f"{loss_type}: loss {loss:.6f}, margins {metrics['rewards/margins']:.6f}, "
              f"accuracies {metrics['rewards/accuracies']:.2f}")
    batch, (pc, pr, rc, rr) = first
    out_pairs = [{"prompt_input_ids": p["prompt_ids"], "chosen_input_ids": p["chosen_ids"],
                  "rejected_input_ids": p["rejected_ids"],
                  "policy_chosen_logps": pc[i].item(), "policy_rejected_logps": pr[i].item(),
                  "ref_chosen_logps": rc[i].item(), "ref_rejected_logps": rr[i].item()}
                 for i, p in enumerate(pairs)]
    with open(os.path.join(loss_dir, "expected.json"), "w") as f:
        json.dump({"generator": "tools/make_dpo_fixtures.py", "trl": trl.__version__,
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "beta": BETA, "pad_token_id": PAD_ID, "pairs": out_pairs,
                   "batch": {k: batch[k].tolist() for k in ("input_ids", "attention_mask", "completion_mask")},
                   "runs": runs}, f, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("DPO parity fixtures made by the real TRL DPOTrainer with tools/make_dpo_fixtures.py (its docstring "
                "says what each file holds):\n\n    .venv/bin/python tools/make_dpo_fixtures.py --out tests/fixtures/dpo\n\n"
                "with python %s, trl %s, transformers %s, torch %s, datasets %s, tokenizers %s (versions read at "
                "generation time).\n" % (sys.version.split()[0], trl.__version__, transformers.__version__,
                                          torch.__version__, datasets.__version__, tokenizers.__version__))
    print(f"{len(cases)} tokenize cases; {len(pairs)} pairs, {len(runs)} loss types -> {a.out}")


if __name__ == "__main__":
    main()
