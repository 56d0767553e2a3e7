#!/bin/bash
# Has a change moved the served select's bits or its time? On the GPU machine, after the device kit's install:
#   bash benchmarks/device/select_check.sh OUT_DIR [GPU]
# select_digest for both heads, compared line by line with the stored reference digests
# (benchmarks/results/select-check/h200_d642fc5/digest_*.txt, H200; digests are per card, and an H100's have equalled
# an H200's at every commit compared), then head_bench's
# served variant for both heads (post-logits ms beside SGLang's built-in head). Prints MATCH / DIFF per head and
# the head_bench rows; exit 1 when a digest differs. GPU picks the card (default 0).
# AB_TREE=DIR (a folder holding another commit's sglang_lilicorr/, carried: `mkdir -p .dev/ab/C && git archive C
# sglang_lilicorr | tar -x -C .dev/ab/C`) then times the paper head's served select of this package and of that one on
# the same card, alternating (the order turned each round), AB_ROUNDS (3) rounds each: per bs the medians, their
# ratio, and the built-in head's median in each process (how far the card drifted between them) -> OUT_DIR/ab.json.
# The cost of a change measured beside its baseline on one card, not across machines.
set -u -o pipefail
O=${1:?usage: bash benchmarks/device/select_check.sh OUT_DIR [GPU]}
SITE=${DEVICE_SITE:-/tmp/site}
mkdir -p "$O"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
source "$(dirname "$0")/lab.sh"  # ROOT, after the installed package on the path: `python3 -m benchmarks STEP` from any folder
R=$ROOT
export CUDA_VISIBLE_DEVICES=${2:-0} SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python PYTHONUNBUFFERED=1
[ -z "${AB_TREE:-}" ] || AB_TREE=$(cd "$AB_TREE" 2>/dev/null && pwd) || { echo "AB_TREE: no such folder"; exit 2; }
cd /tmp || exit 1  # not the checkout: the installed package (in $SITE) is the one measured
nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tee "$O/card.txt"
rc=0
for geo in paper testbed; do
  python3 -m benchmarks select-digest --geometry "$geo" > "$O/digest_$geo.txt" 2>&1
  if diff <(grep "^served " "$O/digest_$geo.txt") <(grep "^served " "$R/benchmarks/results/select-check/h200_d642fc5/digest_${geo}.txt") > "$O/digest_$geo.diff"; then
    echo "digest $geo: MATCH"
  else
    echo "digest $geo: DIFF (see $O/digest_$geo.diff)"; rc=1
  fi
  python3 -m benchmarks head-bench --geometry "$geo" --variants served --out "$O/hb_$geo.json" > "$O/hb_$geo.log" 2>&1
  python3 -c "
import json; a = json.load(open('$O/hb_$geo.json'))
for r in a['rows']: print('$geo', 'bs', r['bs'], 'served %.4f ms, built-in %.4f ms' % (r['post_logits_served'], r['post_logits_builtin']))" || rc=1
done
if [ -n "${AB_TREE:-}" ]; then
  [ -d "$AB_TREE/sglang_lilicorr" ] || { echo "AB_TREE=$AB_TREE holds no sglang_lilicorr/ (see this script's header)"; exit 2; }
  for r in $(seq "${AB_ROUNDS:-3}"); do
    sides="this base"; [ $((r % 2)) = 0 ] && sides="base this"  # the order turns each round
    for side in $sides; do
      path=$SITE; [ "$side" = base ] && path=$AB_TREE:$SITE  # the base tree's package first on the path
      PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH} python3 -m benchmarks head-bench --geometry paper \
        --variants served --out "$O/ab_${side}_$r.json" > "$O/ab_${side}_$r.log" 2>&1 \
        || { echo "head_bench ($side, round $r) failed: $O/ab_${side}_$r.log"; rc=1; }
    done
  done
  python3 - "$O" <<'PY' || rc=1
import glob, json, statistics, sys
out = sys.argv[1]
runs = {s: [json.load(open(f))["rows"] for f in sorted(glob.glob(f"{out}/ab_{s}_*.json"))] for s in ("this", "base")}
table = {}
for bs in sorted({row["bs"] for rows in runs["this"] for row in rows}):
    med = {
        side: {k: statistics.median(r["post_logits_" + k] for rows in rs for r in rows if r["bs"] == bs)
               for k in ("served", "builtin")}
        for side, rs in runs.items()
    }
    table[bs] = {f"{s}_{k}": v for s in med for k, v in med[s].items()}
    table[bs]["served_ratio"] = med["this"]["served"] / med["base"]["served"]
    print("ab paper bs %d: this %.4f ms, base %.4f ms, ratio %.3f (built-in %.4f / %.4f ms)" % (
        bs, med["this"]["served"], med["base"]["served"], table[bs]["served_ratio"], med["this"]["builtin"], med["base"]["builtin"]))
json.dump({"rounds": len(runs["this"]), "bs": table}, open(f"{out}/ab.json", "w"), indent=1)
PY
fi
exit $rc
