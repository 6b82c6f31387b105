#!/usr/bin/env python3
"""Reference token ids from the Hugging Face `tokenizers` library, for titan's HfTokenizer tests.

    .venv/bin/python tools/make_tokenizer_fixtures.py
        [--assets DIR]      default: $TITAN_ASSETS, else <repo>/../shared/assets
        [--out FILE]        default: tests/fixtures/tokenizer/expected.json

Tokenizers are loaded the way torchtitan's HuggingFaceTokenizer loads them: Tokenizer.from_file
(tokenizer.json), then the special tokens of tokenizer_config.json (the standard *_token keys and
added_tokens_decoder) registered with add_special_tokens. For Qwen3 that changes nothing (they are
all in tokenizer.json already); for tiny-bpe-2k it makes <|begin_of_text|> etc. match in text.
Documents are encoded with encode(text, add_special_tokens=False).

Corpora (documents are defined exactly as the C++ test rebuilds them):
  qwen3/tinyshakespeare        datasets/tinyshakespeare.txt split at "\\n\\n", empty pieces dropped
  qwen3/wikitext-2-valid       datasets/wikitext-2/valid.jsonl, the "text" of each non-empty line
  qwen3/wikitext-2-test        datasets/wikitext-2/test.jsonl, likewise
  tiny-bpe-2k/tinyshakespeare  as qwen3/tinyshakespeare
  qwen3/edge_cases             tests/fixtures/tokenizer/edge_cases.jsonl: {"name", "text"} or
  tiny-bpe-2k/edge_cases       {"name", "bytes_b64"} (invalid UTF-8, decoded with errors="replace")
  flags/edge_cases             the same, with a small tokenizer built here and stored inline
                               (tokenizer_json): byte-level BPE from Qwen3's first 1000 merges,
                               "a b" string merges, ignore_merges, NFC, Qwen3's split regex,
                               ByteLevel add_prefix_space, and added tokens using lstrip, rstrip,
                               single_word and normalized (no tokenizer_config.json)

Per corpus: num_docs, docs_sha256 (sha256 over every document as 8-byte little-endian length +
UTF-8 bytes), counts (ids per document), sha256 (per document: sha256 of the ids as
little-endian int32, first 16 hex digits) and ids (the first 50 documents' ids, each cut at
1000 ids; edge cases: every document, complete). Edge cases add names, replaced (U+FFFD
substitutions made by the decode; 0 for valid text), nfc (unicodedata NFC of the text) and
decoded (Tokenizer.decode(ids), special tokens skipped).

Deterministic: rerunning gives an identical file with the same tokenizers version.
"""

import argparse
import base64
import codecs
import hashlib
import json
import os
import struct
import sys
import unicodedata

import tokenizers
from tokenizers import AddedToken, Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EDGE_CASES = "tests/fixtures/tokenizer/edge_cases.jsonl"
FULL_IDS_DOCS = 50
FULL_IDS_CAP = 1000

CORPORA = [
    ("qwen3/tinyshakespeare", "tokenizers/qwen3", "datasets/tinyshakespeare.txt", "paragraphs"),
    ("qwen3/wikitext-2-valid", "tokenizers/qwen3", "datasets/wikitext-2/valid.jsonl", "jsonl"),
    ("qwen3/wikitext-2-test", "tokenizers/qwen3", "datasets/wikitext-2/test.jsonl", "jsonl"),
    ("tiny-bpe-2k/tinyshakespeare", "tokenizers/tiny-bpe-2k", "datasets/tinyshakespeare.txt",
     "paragraphs"),
    ("qwen3/edge_cases", "tokenizers/qwen3", EDGE_CASES, "edge_cases"),
    ("tiny-bpe-2k/edge_cases", "tokenizers/tiny-bpe-2k", EDGE_CASES, "edge_cases"),
    ("flags/edge_cases", "inline", EDGE_CASES, "edge_cases"),
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def flags_tokenizer_json(assets):
    """A small byte-level BPE tokenizer.json exercising the options the real files leave unused."""
    with open(os.path.join(assets, "tokenizers/qwen3/tokenizer.json"), encoding="utf-8") as f:
        qwen = json.load(f)
    merges = qwen["model"]["merges"][:1000]
    vocab = {c: i for i, c in enumerate(bytes_to_unicode())}
    for a, b in merges:
        assert a in vocab and b in vocab
        vocab.setdefault(a + b, len(vocab))
    specs = [("<mask>", dict(lstrip=True, rstrip=True, normalized=False, special=True)),
             ("[SEP]", dict(lstrip=True, normalized=False, special=True)),
             ("hello", dict(single_word=True, normalized=True)),
             ("caf\u00e9", dict(normalized=True)),
             ("<x>", dict(rstrip=True, normalized=False))]
    added = []
    for content, flags in specs:
        t = dict(id=len(vocab) + len(added), content=content, single_word=False, lstrip=False,
                 rstrip=False, normalized=True, special=False)
        t.update(flags)
        added.append(t)
    split = qwen["pre_tokenizer"]["pretokenizers"][0]
    byte_level = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": True, "vocab": vocab,
                  "merges": [f"{a} {b}" for a, b in merges]},
    }


def load_like_torchtitan(tokenizer_dir):
    """Tokenizer.from_file + tokenizer_config.json's special tokens, as torchtitan registers them."""
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    config_path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if not os.path.exists(config_path):
        return tok
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)

    def added(content, spec):
        if isinstance(spec, dict):
            return AddedToken(content, single_word=spec.get("single_word", False),
                              lstrip=spec.get("lstrip", False), rstrip=spec.get("rstrip", False),
                              normalized=spec.get("normalized", True),
                              special=spec.get("special", True))
        return AddedToken(content, special=True)

    new = []
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token",
                "mask_token"):
        spec = config.get(key)
        content = spec.get("content") if isinstance(spec, dict) else spec
        if content is not None:
            new.append(added(content, spec))
    for spec in config.get("added_tokens_decoder", {}).values():
        if isinstance(spec, dict) and "content" in spec:
            new.append(added(spec["content"], spec))
    if new:
        tok.add_special_tokens(new)
    return tok


def decode_counting(raw):
    """bytes.decode("utf-8", errors="replace") plus the number of U+FFFD substitutions."""
    count = [0]

    def handler(err):
        count[0] += 1
        return ("\ufffd", err.end)

    codecs.register_error("titan_count_replace", handler)
    text = raw.decode("utf-8", errors="titan_count_replace")
    assert text == raw.decode("utf-8", errors="replace")
    return text, count[0]


def read_docs(assets, source, fmt):
    path = os.path.join(ROOT if fmt == "edge_cases" else assets, source)
    if not os.path.exists(path):
        sys.exit(f"missing {path} (set TITAN_ASSETS or pass --assets)")
    with open(path, "rb") as f:
        raw = f.read()
    if fmt == "paragraphs":
        return [d for d in raw.decode("utf-8").split("\n\n") if d], None
    if fmt == "jsonl":
        return [json.loads(line)["text"] for line in raw.decode("utf-8").split("\n") if line], None
    docs, extra = [], {"names": [], "replaced": []}
    for line in raw.decode("utf-8").split("\n"):
        if not line:
            continue
        rec = json.loads(line)
        if "bytes_b64" in rec:
            text, replaced = decode_counting(base64.b64decode(rec["bytes_b64"]))
        else:
            text, replaced = rec["text"], 0
        docs.append(text)
        extra["names"].append(rec["name"])
        extra["replaced"].append(replaced)
    return docs, extra


def ids_hash(ids):
    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()[:16]


def docs_hash(docs):
    h = hashlib.sha256()
    for d in docs:
        b = d.encode("utf-8")
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", default=os.environ.get("TITAN_ASSETS") or
                    os.path.join(ROOT, "..", "shared", "assets"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/tokenizer/expected.json"))
    args = ap.parse_args()

    toks = {}
    out = {
        "generator": "tools/make_tokenizer_fixtures.py",
        "tokenizers_version": tokenizers.__version__,
        "hash": "sha256 of the ids as little-endian int32, first 16 hex digits",
        "corpora": [],
    }
    for name, tok_dir, source, fmt in CORPORA:
        inline = flags_tokenizer_json(args.assets) if tok_dir == "inline" else None
        if inline:
            toks[tok_dir] = Tokenizer.from_str(json.dumps(inline))
        elif tok_dir not in toks:
            toks[tok_dir] = load_like_torchtitan(os.path.join(args.assets, tok_dir))
        tok = toks[tok_dir]
        docs, extra = read_docs(args.assets, source, fmt)
        encs = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
        for i in (0, len(docs) // 2, len(docs) - 1):  # encode_batch == encode, spot check
            assert encs[i] == tok.encode(docs[i], add_special_tokens=False).ids
        edge = fmt == "edge_cases"
        rec = {
            "name": name,
            "tokenizer": tok_dir,
            "source": source,
            "format": fmt,
            **({"tokenizer_json": inline} if inline else {}),
            "num_docs": len(docs),
            "docs_sha256": docs_hash(docs),
            "total_ids": sum(len(e) for e in encs),
            "counts": [len(e) for e in encs],
            "sha256": [ids_hash(e) for e in encs],
            "ids": [e if edge else e[:FULL_IDS_CAP] for e in (encs if edge else encs[:FULL_IDS_DOCS])],
        }
        if edge:
            rec.update(extra)
            rec["nfc"] = [unicodedata.normalize("NFC", d) for d in docs]
            rec["decoded"] = [tok.decode(e) for e in encs]
        out["corpora"].append(rec)
        print(f"{name}: {len(docs)} documents, {rec['total_ids']} ids")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes), tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
