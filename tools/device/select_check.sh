#!/bin/bash
# Has a change moved the served select's bits or its time? On the GPU machine, after the device kit's install:
#   bash tools/device/select_check.sh OUT_DIR [GPU]
# select_digest for both heads, compared line by line with the stored reference digests
# (benchmarks/results/select-check/h200_d642fc5/digest_*.txt, H200; digests are per card, and an H100's have equalled
# an H200's at every commit compared), then head_bench's
# served variant for both heads (post-logits ms beside SGLang's built-in head). Prints MATCH / DIFF per head and
# the head_bench rows; exit 1 when a digest differs. GPU picks the card (default 0).
set -u -o pipefail
O=${1:?usage: bash tools/device/select_check.sh OUT_DIR [GPU]}
R=$(cd "$(dirname "$0")/../.." && pwd)
SITE=${DEVICE_SITE:-/tmp/site}
mkdir -p "$O"
export CUDA_VISIBLE_DEVICES=${2:-0} PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python PYTHONUNBUFFERED=1
cd /tmp || exit 1  # not the checkout: the installed package (in $SITE) is the one measured
nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tee "$O/card.txt"
rc=0
for geo in paper testbed; do
  python3 -m sglang_lilicorr.benchmarks.select_digest --geometry "$geo" > "$O/digest_$geo.txt" 2>&1
  if diff <(grep "^served " "$O/digest_$geo.txt") <(grep "^served " "$R/benchmarks/results/select-check/h200_d642fc5/digest_${geo}.txt") > "$O/digest_$geo.diff"; then
    echo "digest $geo: MATCH"
  else
    echo "digest $geo: DIFF (see $O/digest_$geo.diff)"; rc=1
  fi
  python3 -m sglang_lilicorr.benchmarks.head_bench --geometry "$geo" --variants served --out "$O/hb_$geo.json" > "$O/hb_$geo.log" 2>&1
  python3 -c "
import json; a = json.load(open('$O/hb_$geo.json'))
for r in a['rows']: print('$geo', 'bs', r['bs'], 'served %.4f ms, built-in %.4f ms' % (r['post_logits_served'], r['post_logits_builtin']))" || rc=1
done
exit $rc
