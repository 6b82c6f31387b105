#!/usr/bin/env python3
"""Encode throughput of the Hugging Face `tokenizers` library, the peer of
benchmarks/bench_tokenizer.cpp (titan's native HfTokenizer): the real Qwen3 tokenizer.json on
tinyshakespeare (documents split at blank lines) + WikiText-2 valid and test (.jsonl, one
document per article), MB/s of UTF-8 input, add_special_tokens=False.

    .venv/bin/python tools/bench_tokenizers.py [--threads N] [--passes P]
        [--titan build-tok/benchmarks/titan_bench_tokenizer]

single-threaded: Tokenizer.encode on each document in turn (RAYON_NUM_THREADS=1).
multi-threaded:  Tokenizer.encode_batch over all documents, RAYON_NUM_THREADS=N (default: all
                 CPUs). Rayon's pool size is fixed at first use, so each mode runs in its own
                 subprocess.
cold: the first pass of a freshly loaded tokenizer; warm: the best of the following passes
(the library's BPE cache filled), the same split as titan's benchmark.
With --titan, also runs titan's benchmark binary and prints titan / tokenizers ratios.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assets_dir():
    return os.environ.get("TITAN_ASSETS") or os.path.join(ROOT, "..", "shared", "assets")


def load_docs():
    a = assets_dir()
    path = os.path.join(a, "datasets/tinyshakespeare.txt")
    if not os.path.exists(path):
        sys.exit(f"missing {path} (set TITAN_ASSETS)")
    with open(path, "rb") as f:
        docs = [d for d in f.read().decode("utf-8").split("\n\n") if d]
    for split in ("valid", "test"):
        with open(os.path.join(a, f"datasets/wikitext-2/{split}.jsonl"), "rb") as f:
            docs += [json.loads(line)["text"] for line in f.read().decode("utf-8").split("\n") if line]
    return docs


def measure(mode, passes):
    """Runs in a subprocess whose RAYON_NUM_THREADS is already set. Prints one JSON line."""
    from tokenizers import Tokenizer

    docs = load_docs()
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    tok = Tokenizer.from_file(os.path.join(assets_dir(), "tokenizers/qwen3/tokenizer.json"))

    def one_pass():
        t0 = time.perf_counter()
        if mode == "single":
            n = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
        else:
            n = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
        return time.perf_counter() - t0, n

    cold, ids = one_pass()
    warm = min(one_pass()[0] for _ in range(passes))
    print(json.dumps({"mode": mode, "docs": len(docs), "bytes": nbytes, "ids": ids,
                      "cold_mb_s": nbytes / cold / 1e6, "warm_mb_s": nbytes / warm / 1e6}))


def run_mode(mode, threads, passes):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, __file__, "--measure", mode, "--passes", str(passes)],
                         env=env, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    r["threads"] = threads
    return r


def run_titan(binary):
    out = subprocess.run([binary, "--benchmark_format=json"], check=True, capture_output=True,
                         text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        kind = "warm" if "Warm" in b["name"] else "cold"
        res[(kind, int(b["omp_threads"]))] = b["MB/s"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--titan", help="path of titan_bench_tokenizer, to print ratios")
    ap.add_argument("--measure", choices=["single", "batch"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure(args.measure, args.passes)
        return

    import tokenizers

    rows = [run_mode("single", 1, args.passes), run_mode("batch", args.threads, args.passes)]
    print(f"tokenizers {tokenizers.__version__}, Qwen3 tokenizer, {rows[0]['docs']} documents, "
          f"{rows[0]['bytes'] / 1e6:.2f} MB, {rows[0]['ids']} ids")
    for r in rows:
        label = "encode, 1 thread" if r["mode"] == "single" else f"encode_batch, {r['threads']} threads"
        print(f"  {label:28s} cold {r['cold_mb_s']:7.2f} MB/s   warm {r['warm_mb_s']:7.2f} MB/s")
    if args.titan:
        t = run_titan(args.titan)
        print("titan HfTokenizer / tokenizers:")
        for r in rows:
            th = 1 if r["mode"] == "single" else r["threads"]
            for kind in ("cold", "warm"):
                if (kind, th) in t:
                    print(f"  {th} thread(s) {kind}: titan {t[(kind, th)]:7.2f} MB/s vs "
                          f"{r[kind + '_mb_s']:7.2f} MB/s -> {t[(kind, th)] / r[kind + '_mb_s']:.2f}x")


if __name__ == "__main__":
    main()
