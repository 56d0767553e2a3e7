#!/bin/bash
# The multi-GPU checks: benchmarks/device/tp_check.sh's steps as calls, back to back on one warm machine (each call at most 600 s;
# the first of a machine carries the device kit [".dev/whl", ".dev/pkgs", ".dev/bin", ".dev/manifest.txt"] and
# installs). Servers on disjoint GPUs side by side, training alone.
# nvidia-h100-x4 (about 20 minutes held):
#     bash benchmarks/device/tp_calls.sh 1   # install, models; TP = 1 (GPU 0) | TP = 2 (GPUs 1, 2)                      ~320 s
#     bash benchmarks/device/tp_calls.sh 2   # TP = 4 (every GPU); --dp-size 2                                            ~340 s
#     bash benchmarks/device/tp_calls.sh 3   # compare, check; NCCL all-reduce; train on 1, 2, 4 GPUs alone; trainreport ~330 s
#     bash benchmarks/device/tp_calls.sh 4   # train on 2 GPUs killed and resumed; profile training on 1 and 4 GPUs     ~220 s
# nvidia-h100-x4, the reruns of 337b0ae (about 13 minutes held; 558 s and 222 s on 4 x H100 at 337b0ae):
#     bash benchmarks/device/tp_calls.sh x4-serve    # install, models; TP = 4 with the proposal record; --dp-size 2, 4; compare, check
#     bash benchmarks/device/tp_calls.sh x4-train    # train on 1 and 4 GPUs alone; 4 GPUs killed and resumed; trainreport; the NCCL
#                                        #   vocabulary-parallel proposal test on 2 and 4 GPUs
# nvidia-h100-x2 (about 12 minutes held; LILICORR alone at TP = 1 and 2, DFLASH beside it measured on x4):
#     bash benchmarks/device/tp_calls.sh x2-train    # install, models; NCCL; train on 1, 2 GPUs alone; profile both    ~250 s
#     bash benchmarks/device/tp_calls.sh x2-serve2   # TP = 2 with the proposal record                                 ~150 s
#     bash benchmarks/device/tp_calls.sh x2-serve1   # TP = 1 with the proposal record; compare, check; train on 2 GPUs
#                                        #   killed and resumed; trainreport                                ~200 s
# Each call returns $OUT/callN.tar.gz (its summaries, client results, metrics, profiles, curves.png and $W/logs)
# and prints its summaries. Env: TRAIN_STEPS (120; every train step the same), RESUME_AT (70), and tp_check.sh's.
# Exit: 0 when every step of the call passed.
set -u -o pipefail
CALL=${1:?usage: bash benchmarks/device/tp_calls.sh 1|2|3|4|x4-serve|x4-train|x2-train|x2-serve2|x2-serve1}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CHECK=$ROOT/benchmarks/device/tp_check.sh
RET=${OUT:-/tmp/tp_calls_out}
export OUT=/tmp/tp_calls/call$CALL W=${W:-/tmp/tpcheck} TRAIN_STEPS=${TRAIN_STEPS:-120} RESUME_AT=${RESUME_AT:-70}
rm -rf "$OUT" && mkdir -p "$OUT" "$RET"
rc=0

side_by_side() {  # side_by_side "GPUS TAG STEPS" ...: one tp_check.sh per argument, at once; rc 1 if any failed
  local pids=() spec gpus tag steps
  for spec in "$@"; do
    read -r gpus tag steps <<< "$spec"
    CUDA_VISIBLE_DEVICES=$gpus TAG=$tag bash "$CHECK" "$steps" > "$OUT/stdout_$tag.txt" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
}

case $CALL in
1) bash "$CHECK" install,models || { tar -czf "$RET/call1.tar.gz" -C "$OUT" .; cat "$OUT"/summary*.txt; exit 1; }
   side_by_side "0 tp1 serve1" "1,2 tp2 serve2" ;;
2) bash "$CHECK" serve4,dp2 || rc=1 ;;
3) bash "$CHECK" compare,check,nccl,train1,train2,train4,trainreport || rc=1 ;;
4) bash "$CHECK" resume2,profile1,profile4,trainreport || rc=1 ;;
x4-serve) bash "$CHECK" install,models || { tar -czf "$RET/callx4-serve.tar.gz" -C "$OUT" .; cat "$OUT"/summary*.txt; exit 1; }
   SERVE_DFLASH=0 bash "$CHECK" serve4,dp2,dp4,compare,check || rc=1 ;;
x4-train) bash "$CHECK" train1,train4,resume4,trainreport,vptest || rc=1 ;;
x2-train) bash "$CHECK" install,models,nccl,train1,train2,profile1,profile2,trainreport || rc=1 ;;
x2-serve2) SERVE_DFLASH=0 bash "$CHECK" serve2 || rc=1 ;;
x2-serve1) SERVE_DFLASH=0 bash "$CHECK" serve1,compare,check,resume2,trainreport || rc=1 ;;
*) echo "tp_calls.sh: unknown call $CALL: 1, 2, 3, 4, x4-serve, x4-train, x2-train, x2-serve2 or x2-serve1" >&2; exit 2 ;;
esac
mkdir -p "$OUT/logs" && cp "$W"/logs/*.log "$OUT/logs/" 2>/dev/null
tar -czf "$RET/call$CALL.tar.gz" -C "$OUT" . && ls -l "$RET"
for f in "$OUT"/summary*.txt; do echo "--- $(basename "$f")"; cut -c1-400 "$f"; done
exit $rc
