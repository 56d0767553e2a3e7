#!/bin/bash
# Multi-GPU checks on the lent machine (nvidia-h100-x4): LILICORR under tensor parallelism (TP = 1, 2, 4, beside
# DFLASH at the same TP) and `lilicorr train` over NCCL on 1, 2 and 4 GPUs at one global batch. The models are the
# seeded random target + drafts of benchmarks/multi_gpu/tp_models.py, written on the machine (no carry beyond the device kit).
#
# CPU side, once, from the project root:   bash ../shared/device/prepare.sh
# The calls (four, back to back on one warm nvidia-h100-x4, steps side by side on disjoint GPUs where they can be)
# are benchmarks/device/tp_calls.sh's; a single step runs as `bash benchmarks/device/tp_check.sh STEPS` on a machine the install step set up.
# Steps of one invocation share $S; invocations side by side set TAG (summary_TAG.txt) and CUDA_VISIBLE_DEVICES.
#
# Steps (comma-separated, run in this order):
#   install      the device kit's install.sh (bundle, patches, this project)
#   models       python3 -m benchmarks tp-models $W: target, lilicorr_draft, dflash_draft, conversations.jsonl
#   serveN       TP = N (N in 1 2 4 8): a LILICORR server recording proposals (LILICORR_PROPOSAL_RECORD: the first
#                block each rank drafts, $W/tpN/proposals_rank*.jsonl, copied to $O/tpN_proposals_rank*.jsonl),
#                gpu_client.py (24 greedy prompts one at a time, then 1, 4, 16 concurrent) -> $O/lilicorr_tpN.json;
#                then DFLASH with the same drafter -> $O/dflash_tpN.json. Logs: $W/logs/
#   dpN          --dp-size N (N in 2 4): N LILICORR replicas (one GPU each) through the same client -> $O/lilicorr_dpN.json
#                (the check step judges its greedy responses too)
#   compare      tp_compare.py serve: every rank drafted the same first blocks (RANKS_AGREE), the first blocks of
#                TP = 2, 4 against TP = 1, accepted length, ms per block and tokens/s per algorithm and TP
#   check        `python3 -m benchmarks greedy-check` on every greedy response (teacher-forced float32 target)
#   nccl         benchmarks/multi_gpu/nccl_bench.py on 2, 4 and 8 GPUs (as many as the machine has): all-reduce ms and bus bandwidth,
#                the transports NCCL chose
#   trainN       torchrun --nproc-per-node N -m sglang_lilicorr.cli train, global batch 32 (8 x 4/N x N), TRAIN_STEPS
#                steps, one checkpoint at the end -> $W/train_gpuN (metrics.jsonl copied to $O/train_gpuN.jsonl)
#   resumeN      (N in 2 4) trainN's run killed (SIGKILL, every rank) once past step RESUME_AT (120), then the same command again: it
#                resumes from its last checkpoint (every TRAIN_STEPS / 4 steps); the run's files listed (rank 0 writes them) ->
#                $O/train_gpuN_resumed.jsonl, beside the others in trainreport
#   profileN     (N in 1 2 4 8) steps 21-23 of a 30-step run under benchmarks/multi_gpu/train_profile.py -> $O/profile_gpuN/rank*.txt
#                and rank*.trace.json.gz (the window's timeline with the trainer's phase marks: chrome://tracing, Perfetto)
#   trainreport  tp_compare.py train over the runs made: loss curves against 1 GPU, tokens/s and scaling, curves.png
#   vptest       scripts/gpu_tests.sh tests/test_vocab_parallel.py (NCCL proposal on 2 and 4 GPUs) -> $O/gpu_tests_vocab_parallel.txt
# Env: W (/tmp/tpcheck), DEVICE_SITE (/tmp/site), TIMEOUT (server start limit, 330 s), TRAIN_STEPS (200), SERVE_DFLASH
#   (1; 0: the serve steps start LILICORR only), EXTRA_ARGS (appended to every server's args).
# Output in $OUT: summary.txt (summary_TAG.txt), lilicorr_tpN.json / dflash_tpN.json of the serve steps run in the call,
#   train_gpuN.jsonl, profile_gpuN/, curves.png.
set -u -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false LILICORR_T_GT_0=allow-greedy
source "$(dirname "${BASH_SOURCE[0]}")/lab.sh"  # ROOT; `python3 -m benchmarks STEP` from any folder; the lab's plugin
B=$ROOT/.dev/bin
SITE=${DEVICE_SITE:-/tmp/site}
W=${W:-/tmp/tpcheck}
O=${OUT:-/tmp/tpcheck_out}
S=$O/summary${TAG:+_$TAG}.txt
STEPS=${1:-install}
mkdir -p "$O" "$W/logs"
source "$ROOT/benchmarks/device/check_lib.sh"
cd /tmp || exit 1  # not the checkout: its plain sglang_lilicorr/ would shadow the installed package

if has install; then
  say "== install"
  source "$B/install.sh" > "$W/install.txt" 2>&1 || { tail -n 20 "$W/install.txt" | tee -a "$S"; exit 1; }
  tail -n 3 "$W/install.txt" | tee -a "$S"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
else
  use_install tp_check.sh
fi

if has models; then
  say "== models"
  timeout 300 python3 -m benchmarks tp-models "$W" 2>&1 | grep -v "it/s" | tail -n 2 | tee -a "$S" || fails+=(models)
fi

serve() {  # serve NAME PORT -- SERVER_ARGS: client results in $O/NAME.json (and $W), server log in $W/logs/NAME.log
  local name=$1 port=$2; shift 3
  [ -f "$W/target/config.json" ] || { say "no target in $W/target (run the models step)"; return 1; }
  local log=$W/logs/$name.log rc=1
  if start_server "$name" "$port" "$log" --model-path "$W/target" --attention-backend triton --sampling-backend pytorch \
    --grammar-backend none --disable-custom-all-reduce --mem-fraction-static 0.5 --context-length 2048 \
    --max-running-requests 32 --cuda-graph-max-bs-decode 16 --cuda-graph-backend-prefill disabled "$@" "${EXTRA[@]}"; then
    timeout 240 python3 -m benchmarks gpu-client "$port" "$W/target" "$O/$name.json" --greedy 24 --sampled 0 \
      --concurrency 1 4 16 2>&1 | tail -n 6 | tee -a "$S" && rc=0 && cp "$O/$name.json" "$W/"
  fi
  stop_server
  grep -E "LILICORR|Capture draft|Traceback|Error" "$log" | cut -c1-300 | head -n 12 | tee -a "$S"
  return $rc
}

for n in 1 2 4 8; do
  has "serve$n" || continue
  say "== serve at TP = $n"
  rm -rf "$W/tp$n"
  LILICORR_PROPOSAL_RECORD=$W/tp$n \
    serve "lilicorr_tp$n" $((30100 + n)) -- --tp-size "$n" --speculative-algorithm LILICORR \
    --speculative-draft-model-path "$W/lilicorr_draft" --speculative-draft-attention-backend triton || fails+=("lilicorr_tp$n")
  for f in "$W/tp$n"/proposals_rank*.jsonl; do [ -f "$f" ] && cp "$f" "$O/tp${n}_$(basename "$f")"; done
  [ "${SERVE_DFLASH:-1}" = 1 ] || continue
  serve "dflash_tp$n" $((30200 + n)) -- --tp-size "$n" --speculative-algorithm DFLASH \
    --speculative-draft-model-path "$W/dflash_draft" --speculative-draft-attention-backend triton || fails+=("dflash_tp$n")
done

for n in 2 4; do
  has "dp$n" || continue
  say "== --dp-size $n: $n LILICORR replicas, one GPU each"
  serve "lilicorr_dp$n" $((30300 + n)) -- --dp-size "$n" --speculative-algorithm LILICORR \
    --speculative-draft-model-path "$W/lilicorr_draft" --speculative-draft-attention-backend triton || fails+=("lilicorr_dp$n")
done

if has compare; then
  say "== compare (the serve steps of earlier calls left their results in $W)"
  degrees=(); for n in 1 2 4 8; do [ -d "$W/tp$n" ] && degrees+=("$n"); done
  python3 -m benchmarks tp-compare serve "$W" --tp "${degrees[@]}" 2>&1 | tee -a "$S" || fails+=(ranks_agree)
fi

if has check; then
  say "== check"
  R=(); for n in 1 2 4 8; do for a in lilicorr dflash; do [ -s "$W/${a}_tp$n.json" ] && R+=("$W/${a}_tp$n.json"); done; done
  for n in 2 4; do [ -s "$W/lilicorr_dp$n.json" ] && R+=("$W/lilicorr_dp$n.json"); done
  timeout 300 python3 -m benchmarks greedy-check "$W/target" "${R[@]}" 2>&1 | grep -v "Loading weights\|Warning" \
    | tail -n 20 | tee -a "$S"
  grep -q "GREEDY_CHECK PASS" "$S" || fails+=(greedy_check)
fi

if has nccl; then
  say "== NCCL all-reduce between the GPUs (NCCL_DEBUG=INFO transport lines in $W/logs/nccl_gpuN.log)"
  for n in 2 4 8; do
    (( n <= $(nvidia-smi -L | wc -l) )) || break
    NCCL_DEBUG=INFO timeout 120 torchrun --nproc-per-node "$n" --master-port $((29600 + n)) -m benchmarks nccl-bench \
      > "$W/logs/nccl_gpu$n.log" 2>&1 || fails+=("nccl$n")
    grep "NCCL all-reduce" "$W/logs/nccl_gpu$n.log" | tee -a "$S"
    grep -o "via [A-Za-z/]*" "$W/logs/nccl_gpu$n.log" | sort | uniq -c | tee -a "$S"
  done
fi

train_args() {  # train_args NAME N [SAVE_EVERY]: the plan's `lilicorr train` arguments into TRAIN_ARGS: N GPUs, global
                #   batch 32 (8 x 4/N x N), into $W/NAME (resumes what is there), a checkpoint every SAVE_EVERY steps
                #   (TRAIN_STEPS / 4)
  TRAIN_ARGS=(--target "$W/target" --data "$W/conversations.jsonl" --output-dir "$W/$1" --batch-size 8
    --grad-accum $((4 / $2)) --max-steps "${TRAIN_STEPS:-200}" --max-length 1024 --log-every 10 --eval-every 50
    --save-every "${3:-$(( ${TRAIN_STEPS:-200} / 4 ))}" --eval-examples 32 --mask-token "<|mask|>")
}
train() {  # train NAME N [SAVE_EVERY]: `lilicorr train` on N GPUs
  train_args "$@"
  torchrun --nproc-per-node "$2" --master-port $((29500 + $2)) -m sglang_lilicorr.cli train "${TRAIN_ARGS[@]}"
}

runs=()
for n in 1 2 4; do
  has "train$n" || continue
  say "== train on $n GPU(s): batch 8 x accumulation $((4 / n)) x $n ranks"
  rm -rf "$W/train_gpu$n"
  # one checkpoint, at the end: rank 0's writes would land in the timed windows
  timeout 580 bash -c "$(declare -f train_args train); W=$W; train train_gpu$n $n ${TRAIN_STEPS:-200}" > "$W/logs/train_gpu$n.log" 2>&1 || fails+=("train$n")
  tail -n 3 "$W/logs/train_gpu$n.log" | cut -c1-300 | tee -a "$S"
  cp "$W/train_gpu$n/metrics.jsonl" "$O/train_gpu$n.jsonl" 2>/dev/null
done
for n in 2 4; do  # resumeN: killed (SIGKILL, every rank) once past step RESUME_AT, then the same command again
  has "resume$n" || continue
  say "== train on $n GPUs, killed past step ${RESUME_AT:-120}, resumed"
  R=$W/train_gpu${n}_resumed; rm -rf "$R"
  setsid bash -c "$(declare -f train_args train); W=$W; train train_gpu${n}_resumed $n" > "$W/logs/resume${n}_a.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    last=$(tail -n 1 "$R/metrics.jsonl" 2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.read() or "{}").get("step", 0))' 2>/dev/null)
    # torchrun's workers leave the group it started in: every process of the run goes, by its output folder
    [ "${last:-0}" -ge "${RESUME_AT:-120}" ] && { kill -9 -- -"$pid"; pkill -9 -f -- "--output-dir $R( |$)"; say "killed at step $last"; break; }
    sleep 2
  done
  wait "$pid" 2>/dev/null
  timeout 400 bash -c "$(declare -f train_args train); W=$W; train train_gpu${n}_resumed $n" > "$W/logs/resume${n}_b.log" 2>&1 || fails+=("resume$n")
  grep -m2 -i "resum" "$W/logs/resume${n}_b.log" | cut -c1-200 | tee -a "$S"
  say "files of the run (rank 0 writes; no per-rank checkpoint): $(cd "$R" && find . -type f | sort | tr '\n' ' ' | cut -c1-600)"
  cp "$R/metrics.jsonl" "$O/train_gpu${n}_resumed.jsonl" 2>/dev/null
done
for n in 1 2 4 8; do  # steps 21-23 of a 30-step run under benchmarks/multi_gpu/train_profile.py: each rank's ops, kernels, trace
  has "profile$n" || continue
  say "== profile training on $n GPU(s): steps 21-23"
  rm -rf "$W/profile_gpu$n"
  train_args "profile_gpu$n" "$n"
  timeout 300 torchrun --nproc-per-node "$n" --master-port $((29700 + n)) -m benchmarks train-profile --window 20 3 \
    --out "$O/profile_gpu$n" -- "${TRAIN_ARGS[@]}" --max-steps 30 --save-every 1000 > "$W/logs/profile_gpu$n.log" 2>&1 \
    || fails+=("profile$n")
  head -n 1 "$O"/profile_gpu"$n"/rank*.txt 2>/dev/null | grep rank | tee -a "$S"
done
if has trainreport; then
  for n in 1 2 4; do [ -s "$W/train_gpu$n/metrics.jsonl" ] && runs+=("$W/train_gpu$n"); done
  for n in 2 4; do [ -s "$W/train_gpu${n}_resumed/metrics.jsonl" ] && runs+=("$W/train_gpu${n}_resumed"); done
  python3 -m benchmarks tp-compare train "${runs[@]}" --plot "$O/curves.png" 2>&1 | tee -a "$S" || fails+=(trainreport)
fi
if has vptest; then  # the NCCL vocabulary-parallel proposal test on 2 and 4 GPUs (as many as the machine has)
  say "== GPU tests: tests/test_vocab_parallel.py"
  timeout 300 bash "$ROOT/scripts/gpu_tests.sh" "$ROOT/tests/test_vocab_parallel.py" > "$O/gpu_tests_vocab_parallel.txt" 2>&1 \
    || fails+=(vptest)
  tail -n 3 "$O/gpu_tests_vocab_parallel.txt" | tee -a "$S"
fi
say "done; failed: ${fails[*]:-none}"
[ ${#fails[@]} = 0 ]
