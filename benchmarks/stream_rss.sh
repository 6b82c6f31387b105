#!/usr/bin/env bash
# A corpus larger than memory streams at a flat RSS: writes a JSON-lines corpus of GB gigabytes
# (C4-like records of about 2 KB) into DIR unless it is there already, then trains STEPS steps of
# qwen3_debugmodel on it twice, each with /usr/bin/time -v: the first run indexes the file, the
# second reuses the saved index. Prints the corpus size against the machine's memory, each run's
# peak RSS and wall time, and the index's size.
#
#   benchmarks/stream_rss.sh [BUILD_DIR=build] [GB=30] [DIR=/tmp/titan-stream] [STEPS=50]
#
# A benchmark, not a test: it needs GB gigabytes of free disk and minutes to write them.
set -euo pipefail
build="${1:-build}"
gb="${2:-30}"
dir="${3:-/tmp/titan-stream}"
steps="${4:-50}"
titan="$build/titan"
[ -x "$titan" ] || { echo "stream_rss: no $titan (build first: scripts/build.sh $build)" >&2; exit 1; }
mkdir -p "$dir"
corpus="$dir/corpus-${gb}g.jsonl"
if [ ! -s "$corpus" ]; then
  echo "writing $corpus ($gb GB) ..."
  python3 - "$corpus" "$gb" <<'PY'
import random, sys
path, gb = sys.argv[1], float(sys.argv[2])
rng = random.Random(0)
words = [''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randint(2, 9)))
         for _ in range(5000)]
chunks = [' '.join(rng.choice(words) for _ in range(40)) for _ in range(2000)]
target = int(gb * 1e9)
with open(path + '.tmp', 'w') as f:
    n = i = 0
    while n < target:
        lines = []
        for _ in range(1000):
            text = ' '.join(chunks[rng.randrange(2000)] for _ in range(rng.randint(2, 12)))
            lines.append('{"text": "doc %d %s", "url": "https://example.org/%d"}\n' % (i, text, i))
            i += 1
        block = ''.join(lines)
        f.write(block)
        n += len(block)
import os
os.rename(path + '.tmp', path)
PY
fi
size=$(stat -c %s "$corpus")
mem=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
avail=$(awk '/MemAvailable/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
echo "corpus: $(numfmt --to=iec "$size") on disk; memory: $(numfmt --to=iec "$mem") total," \
     "$(numfmt --to=iec "$avail") available; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
out="$dir/outputs"
rm -rf "$out"
for run in "first (indexes the file)" "second (reuses the index)"; do
  log="$dir/run.log"
  /usr/bin/time -v "$titan" train --config qwen3_debugmodel --dataloader.dataset jsonl \
    --dataloader.dataset_path "$corpus" --training.steps "$steps" --metrics.log_freq "$steps" \
    --dump_folder "$out" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  rss=$(awk '/Maximum resident set size/ {print $NF}' "$log")
  wall=$(awk '/Elapsed \(wall clock\)/ {print $NF}' "$log")
  echo "$run run: peak RSS $(numfmt --to=iec $((rss * 1024))), wall $wall"
  grep -E "dataloader: [0-9]+ documents|reused the saved index|step: +$steps " "$log" | sed 's/^/  /'
done
echo "index: $(du -sh "$out/dataset_index" | cut -f1) in $out/dataset_index"
