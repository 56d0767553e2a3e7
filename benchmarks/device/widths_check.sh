#!/bin/bash
# The adaptive verify width on the GPU: call 2 after `gpu_check.sh install` (carry .dev/{smolB,bin}), on the same
# warm machine. The target and a random-head draft (gpu_check.sh's model step), then for each of WIDTH_SETTINGS
# (default "adaptive 4") a LILICORR server with LILICORR_VERIFY_WIDTH set to it: the gpu-client step's greedy, sampled and
# concurrent requests and the fp32 greedy check (gpu_check.sh lilicorr,check). A random head's drafts are rejected,
# so `adaptive` serves mostly width 1 (plain decode steps through the verify path) and `4` verifies narrow blocks.
# -> $OUT/SETTING/{summary.txt,lilicorr.json,lilicorr.log}, $OUT/sglang_jit.tar.gz where
# the servers built SGLang JIT kernels (keep it as .dev/sglang_jit/sglang_jit.tar.gz); the key lines printed.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RET=${OUT:-/tmp/widths_out}
mkdir -p "$RET"
steps=${WIDTH_STEPS:-model,lilicorr,check}
for s in ${WIDTH_SETTINGS:-adaptive 4}; do
  O=$RET/$s && rm -rf "$O" && mkdir -p "$O"  # under $OUT: what a setting wrote comes back even if the call is cut
  echo "== LILICORR_VERIFY_WIDTH=$s ($steps)"
  OUT=$O LILICORR_VERIFY_WIDTH=$s timeout "${SETTING_SECONDS:-280}" bash "$ROOT/benchmarks/device/gpu_check.sh" "$steps" 2>&1 | tail -n 12
  steps=lilicorr,check
  pkill -f sglang.launch_server 2>/dev/null; sleep 1  # a setting cut by its timeout leaves no server behind
  grep -hE "verify width|replay in|GREEDY_CHECK|CLIENT_CHECK|Traceback|Error" "$O/lilicorr.log" "$O/summary.txt" 2>/dev/null \
    | cut -c1-400 | head -n 20
  python3 - "$O/lilicorr.json" <<'PY' 2>&1 | tail -n 3
import collections, json, sys
recs = json.load(open(sys.argv[1]))
recs = recs.get("records", recs) if isinstance(recs, dict) else recs
widths = collections.Counter()
for r in recs:
    for w, n in enumerate(r.get("meta", {}).get("spec_cap_lens_histogram") or []):
        widths[w] += n
print("verify steps by width (meta_info spec_cap_lens_histogram):", dict(sorted(w for w in widths.items() if w[1])),
      "over", len(recs), "responses")
PY
done
PYTHONPATH=${DEVICE_SITE:-/tmp/site} timeout 120 bash "$ROOT/scripts/gpu_tests.sh" "$ROOT/tests/test_verify_width.py" 2>&1 \
  | tail -n 4 | tee "$RET/gpu_tests.txt"
bash "$ROOT/benchmarks/device/sglang_jit.sh" pack "$RET"  # SGLang's JIT builds, for the next machine's servers
