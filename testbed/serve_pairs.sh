#!/bin/bash
# Repeated LILICORR / DFLASH pairs in alternating order on one warm GPU machine, each pair a fresh
# pair of servers through testbed/serve_eval.sh (its env: CONCURRENCY, PER_SET, MAX_TOKENS, WARMUP,
# STAGE_TIMING, BUDGET, RESERVE, ...), so that server-process noise can be pooled away:
#     PAIRS=3 FIRST=1 bash testbed/serve_pairs.sh      -> $OUT/run1 .. $OUT/run3
# Pair i runs "dflash lilicorr" when i is odd and "lilicorr dflash" when even (FIRST shifts i, so that
# consecutive calls keep alternating). Each pair's stage tables (STAGE_TIMING=1) are printed, since
# deep folders may not come back from the GPU machine. Pool the runs on the CPU machine with
#     lilicorr bench report run*/results.jsonl --block-ref dflash --out pooled
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
O=${OUT:-/tmp/serve_pairs_out}
mkdir -p "$O"
first=${FIRST:-1}
for ((i = first; i < first + ${PAIRS:-2}; i++)); do
  if ((i % 2)); then order="dflash lilicorr"; else order="lilicorr dflash"; fi
  echo "== pair $i: $order ($(date -u +%T))"
  OUT=$O/run$i SYSTEMS="$order" bash "$ROOT/testbed/serve_eval.sh" > "$O/run$i.log" 2>&1 || echo "pair $i: serve_eval.sh exit $?"
  grep -A6 "^|  | Benchmark" "$O/run$i/report.md" 2>/dev/null | head -n 12
  for f in "$O/run$i"/stages/c*/stages.md; do [ -f "$f" ] && { echo "-- $f"; cat "$f"; }; done
done
