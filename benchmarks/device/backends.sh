#!/bin/bash
# The attention backends on the lent GPU machine: LILICORR served with the target on --attention-backend flashinfer (the draft's
# attention stays triton, the only one the plugin serves) and --sampling-backend flashinfer: the served greedy check,
# T = 1 through flashinfer's sampling kernels with the per-position chi-square test, and the served-speed benchmark's
# paired rounds. Six calls back to back on one warm nvidia-h200 (a fresh machine between them: exit 3, start again at
# call 1). Each call: bash benchmarks/device/backends.sh STEP[,STEP...] (steps run in the order below, whatever the order
# given).
#
# CPU side first (benchmarks/device/README.md, "SmolLM2-135M on the device" and "flashinfer on the GPU machine"): the shipped
# drafts' weights moved out of the tree into .dev/ckpt, .dev/flashinfer from benchmarks/device/flashinfer_kit.sh with the
# JIT cache of the last call that built one (.dev/flashinfer/jit_cache.tar.gz), then
#     bash benchmarks/device/backends.sh carry     # every call's carry below against the 64 MiB limit, from this checkout
#
# call  command                                               carry                                  MB (tree 6.2)  timeout  expected
# 1     bash benchmarks/device/backends.sh install                 .dev/{whl,pkgs,bin,manifest.txt,smolA}  66.0          300      ~36 s
# 2     CALL_SECONDS=560 bash benchmarks/device/backends.sh flashinfer   .dev/{flashinfer,ckpt,bin}        63.0          600      ~30 s (*)
# 3     bash benchmarks/device/backends.sh model                   .dev/{smolB,bin}                        66.0          300      ~45 s
# 4     CALL_SECONDS=575 bash benchmarks/device/backends.sh greedy,t1   .dev/sglang_jit (**)               6.2 + it      600      ~575 s
# 5     CALL_SECONDS=575 bash benchmarks/device/backends.sh t1,speed    .dev/sglang_jit (**)               6.2 + it      600      ~575 s
# 6     CALL_SECONDS=575 bash benchmarks/device/backends.sh speed  .dev/sglang_jit (**)                    6.2 + it      600      ~350-420 s
# (MB: 10^6 bytes, the tree's tracked and untracked files included; the limit is 67.1. (*) flashinfer.sh unpacks the
# carried cache (benchmarks/device/flashinfer_cache.sh) and builds only what it lacks: on the H200 of 7c30b52 every module
# the warm-up uses was up to date and loaded in under a second each; without the cache the build is ~270 s. Its build
# stops 45 s before the call's deadline and its cache so far comes back (exit 4: carry it and run the step again).
# (**) SGLang's own JIT kernels (benchmarks/device/sglang_jit.sh): unpacked once per machine before any server starts, and
# returned as $OUT/sglang_jit.tar.gz by a call whose servers built more (its call log lists the modules and when).
# Without it a machine's first four servers built 7 modules in 6 minutes and started in 71-146 s, with it in 9-17 s
# (scheduler end to end; 171a5be, backends/h200_171a5be_flashinfer_speed, where the first speed call played one
# round): hence TIMEOUT 480 and the cache carried where a call returned one (a call that finds a step's
# deadline short leaves the step to the next: t1 is in calls 4 and 5 for that). greedy: 88 greedy responses and the
# fp32 check ~50 s after the start-up; t1: a start-up, 4 x 2,000 requests (over 240 s on flashinfer), the chi-square
# check; speed: four servers' start-up and per round ~45 s at c = 1 and ~48 s over c = 4-32 (the Triton rounds of
# serve-speed/h200_ed24a18), five rounds: a call plays what its deadline leaves (a call cut by its deadline exits 1:
# run `speed` again; it resumes). Greedy and T = 1 are measured for flashinfer/triton (backends/h200_7c30b52_flashinfer):
# a later session needs only calls 1-3 and `speed`, and backends_summary keeps the greedy and T = 1 parts from
# summary.json.)
# Device time: ~25-29 minutes with the machine's start and the gaps between calls, of a session's 30. Each step
# checks the call's deadline first (model 60 s, greedy GREEDY_SECONDS 420, t1 T1_SECONDS 420) and is skipped (exit 4)
# when it would run past it: run it in the next call. Nothing here runs past the 600 s timeout, which would lose the
# call's results.
# Then on the CPU machine: unpack every call's results.tar.gz into one folder (later calls replace earlier files: the
# last speed call's bundle holds every round) and
#     python -m benchmarks backends-summary --run DIR --card "H200 (nvidia-h200)" --commit C --out DIR2
# (benchmarks/README.md, "Attention backends"); put call 2's jit_cache.tar.gz (or a later call's, which also holds what
# serving built) at .dev/flashinfer/jit_cache.tar.gz and the last returned sglang_jit.tar.gz at
# .dev/sglang_jit/sglang_jit.tar.gz for later sessions.
#
# Steps:
#   install       .dev/bin/smol.sh install: the kit into /tmp/site, part_a of the GGUF kept in /tmp/smol, the imports;
#                 the card -> card.txt
#   flashinfer    the shipped drafts (checkpoints/smollm2-*/config.json, .dev/ckpt weights) -> /tmp/testbed/drafts;
#                 benchmarks/device/flashinfer.sh: the slim flashinfer into /tmp/site, the carried JIT cache unpacked, every
#                 module built (what the cache lacks) and run once -> flashinfer/flashinfer_warmup.txt, and the whole
#                 cache -> $OUT/jit_cache.tar.gz
#   model         benchmarks/device/gpu_check.sh model with LILICORR_DRAFT=/tmp/testbed/drafts/lilicorr: the target in
#                 /tmp/smol/model, the shipped LiLiCorr draft served (and the same drafter without its head for DFLASH)
#   greedy        ATTN_BACKEND / SAMPLING_BACKEND set, benchmarks/device/gpu_check.sh GREEDY_SYSTEMS (lilicorr),check: the
#                 LILICORR server (CUDA graphs to 16, so c = 32 verifies eagerly), 56 greedy + 6 T = 1 prompts one at a
#                 time, then 1-32 concurrent (88 greedy responses), every greedy token against the fp32 target (near-ties
#                 within 2 bf16 ulps), the proposal captured in the draft CUDA graph -> greedy/{summary.txt,lilicorr.*}
#   t1            the same backends, benchmarks/device/gpu_check.sh sampling for T1_SYSTEMS (lilicorr; "base dflash
#                 lilicorr" is ~3 minutes a system more): 2,000 seeded T = 1 requests per prompt, the chi-square test per
#                 position, no tau (SAMPLING_TAU_SEEDS empty) -> t1/{sampling_summary.json,summary.txt,SYSTEM.log}
#   speed         testbed.sh --attention-backend ATTN --sampling-backend SAMPLING speed --systems base dflash builtin
#                 lilicorr --rounds SPEED_ROUNDS (5) --profile-steps 0 $SPEED_ARGS (c = 1, 4, 8, 16, 32, graphs to 32):
#                 WORK/speed/graphs32_flashinfer, kept apart from any Triton rounds (benchmarks/testbed/speed.py); resumes, so the
#                 same call again plays what the deadline left -> speed/graphs32_flashinfer/
#   triton-speed  (optional, when device time is left) the kit's Triton servers, same systems and rounds, at
#                 TRITON_CONCURRENCY (1): the block over the decode step on Triton on this very machine ->
#                 speed/graphs32/ (backends_summary takes it over the committed Triton figures)
#   carry         (CPU machine) each call's carry and the tree against the 64 MiB limit; exit 1 if one is over
# Env: ATTN_BACKEND, SAMPLING_BACKEND (flashinfer, flashinfer), CALL_SECONDS (570: TESTBED_DEADLINE), TIMEOUT (a
#   server's start-up limit, 480 s), DEVICE_SITE, SMOL_WORK (/tmp/smol), BACKENDS_WORK (/tmp/backends), TESTBED_WORK
#   (/tmp/testbed), SGLANG_JIT_CACHE_DIR (~/.cache/sglang/jit).
# What comes back ($OUT, at most 8 files): results.tar.gz (the folder layout backends_summary --run reads: card.txt,
# flashinfer/, greedy/, t1/, speed/FOLDER/, calls/TIME_STEPS.log), jit_cache.tar.gz (call 2; a later call returns it
# again where serving built modules the warm-up had not), sglang_jit.tar.gz (where the call's servers built SGLang JIT
# modules); a file over 15 MB in 12 MB parts (cat F.part_* > F).
# Exit status: 0 when every step passed; 3 on a fresh machine (run the calls again from 1); 4 when the deadline left a
# step out or stopped flashinfer's build (its line says which: run it in the next call); 1 otherwise (a speed call
# cut by its deadline says so and exits 1: run it again).
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STEPS=${1:?usage: bash benchmarks/device/backends.sh install|flashinfer|model|greedy|t1|speed|triton-speed|carry[,STEP...]}
KNOWN=(install flashinfer model greedy t1 speed triton-speed carry)
for s in ${STEPS//,/ }; do
  [[ " ${KNOWN[*]} " == *" $s "* ]] || { echo "backends.sh: unknown step $s: ${KNOWN[*]}" >&2; exit 2; }
done
has() { [[ ",$STEPS," == *",$1,"* ]]; }
LIMIT=67108864  # the 64 MiB a call carries, the tree included

# each call's carry, as in the table above
CARRY_1=".dev/whl .dev/pkgs .dev/bin .dev/manifest.txt .dev/smolA"
CARRY_2=".dev/flashinfer .dev/ckpt .dev/bin"
CARRY_3=".dev/smolB .dev/bin"
CARRY_4=".dev/sglang_jit?"  # ?: optional (SGLang's JIT cache, where an earlier call returned one)
CARRY_5=".dev/sglang_jit?"
CARRY_6=".dev/sglang_jit?"

tree_bytes() {  # the tracked and untracked-not-ignored files of the checkout (what every call sends besides carry)
  (cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
}

if has carry; then
  tree=$(tree_bytes) over=0
  printf 'tree: %d bytes (tracked and untracked files)\n' "$tree"
  for call in 1 2 3 4 5 6; do
    var=CARRY_$call total=$tree line=""
    for p in ${!var}; do
      optional=${p: -1}; p=${p%\?}
      if [ -e "$ROOT/$p" ]; then
        b=$(find -L "$ROOT/$p" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'); total=$((total + b)); line+=" $p=$b"
      elif [ "$optional" = "?" ]; then line+=" $p=none yet (optional)"
      else line+=" $p=MISSING"; over=1; fi
    done
    if [ "$total" -gt "$LIMIT" ]; then verdict=OVER; over=1; else verdict=ok; fi
    printf 'call %d: %d bytes of %d, %s:%s\n' "$call" "$total" "$LIMIT" "$verdict" "${line:- (nothing carried)}"
  done
  if [ "$over" = 1 ]; then
    echo "backends.sh carry: a call is over 64 MiB or misses a path: move the shipped drafts' weights to .dev/ckpt" \
      "(benchmarks/device/README.md), build .dev/flashinfer (benchmarks/device/flashinfer_kit.sh), fetch the kit (prepare.sh --smol)" >&2
    exit 1
  fi
  exit 0
fi

export TESTBED_DEADLINE=$(( $(date +%s) + ${CALL_SECONDS:-570} )) PYTHONUNBUFFERED=1
# a server's start-up limit (check_lib.sh's TIMEOUT, 330 s): the first flashinfer-target LILICORR start on a fresh
# machine took 257 s to the scheduler's ready line and its first request over 70 s more (h200_7c30b52_flashinfer)
export TIMEOUT=${TIMEOUT:-480}
SITE=${DEVICE_SITE:-/tmp/site}
W=${SMOL_WORK:-/tmp/smol}
BW=${BACKENDS_WORK:-/tmp/backends}
ATTN=${ATTN_BACKEND:-flashinfer}
SAMP=${SAMPLING_BACKEND:-flashinfer}
TB=${TESTBED_WORK:-/tmp/testbed}  # the testbed's WORK (the speed step's folders, drafts/)
DRAFTS=$TB/drafts
RET=${OUT:-/tmp/lilicorr_out}
CACHE=${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer
STAGE=$BW/stage
rm -rf "$STAGE" && mkdir -p "$STAGE/calls" "$RET" "$BW"
log() { echo "[backends $(date +%H:%M:%S)] $*"; }
left() { echo $(( TESTBED_DEADLINE - $(date +%s) )); }
modules_sum() { find "$1" -type f -name '*.so' 2>/dev/null | sort | md5sum | cut -c1-32; }  # a JIT cache's builds
# SGLang's own JIT kernels: benchmarks/device/sglang_jit.sh, its state with this work's (a fresh machine has neither)
export SGLANG_JIT_STATE=$BW/sglang_jit.sum

fresh() {  # exit 3 where an earlier call's work is missing on this machine
  if [ ! -f "$SITE/.device_manifest" ] || [ ! -f "$1" ]; then
    log "$1 is missing: a fresh machine, not the one the earlier calls set up. Run the calls again from call 1 (install)."
    exit 3
  fi
}

gpu_check() {  # gpu_check OUTDIR STEPS: benchmarks/device/gpu_check.sh with this call's backends
  ATTN_BACKEND=$ATTN SAMPLING_BACKEND=$SAMP OUT=$1 SMOL_WORK=$W DEVICE_SITE=$SITE bash "$ROOT/benchmarks/device/gpu_check.sh" "$2"
}

speed_step() {  # speed_step DEST TESTBED_ARGS...: the testbed's speed step, its bundle unpacked into $STAGE/speed/
  local out=$BW/testbed_out rc
  rm -rf "$out" && mkdir -p "$out"
  bash "$ROOT/benchmarks/device/testbed.sh" --work "$TB" --out "$out" "$@" 2>&1 | grep -v "it/s\]\|s/it\]\|Loading weights\|Warning" | tail -n 60
  rc=${PIPESTATUS[0]}
  for b in "$out"/speed_*.tar.gz; do
    [ -f "$b" ] || continue
    local name=${b##*/speed_}; name=${name%.tar.gz}
    mkdir -p "$STAGE/speed/$name" && tar -xzf "$b" -C "$STAGE/speed/$name" && log "speed: -> speed/$name/"
  done
  return "$rc"
}

run_steps() {
  local fails=() rc=0
  enough() {  # enough STEP SECONDS: the call's deadline leaves that long, else the step is left to the next call (exit 4)
    [ "$(left)" -ge "$2" ] && return 0
    log "$1: $(left) s left in this call, $2 needed: run 'bash benchmarks/device/backends.sh $1' in the next call"; rc=4; return 1
  }
  log "steps $STEPS; backends --attention-backend $ATTN --sampling-backend $SAMP (draft: triton); $(left) s to the deadline"
  bash "$ROOT/benchmarks/device/sglang_jit.sh" unpack  # once per machine, before any server starts
  if has install; then
    OUT=$BW/smol_out bash "$ROOT/.dev/bin/smol.sh" install 2>&1 | tail -n 8
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(install)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$STAGE/card.txt"
  fi
  if has flashinfer; then
    fresh "$SITE/.device_manifest"
    for v in lilicorr dflash; do
      mkdir -p "$DRAFTS/$v" && cp "$ROOT/checkpoints/smollm2-$v/config.json" "$DRAFTS/$v/" \
        && cp "$ROOT/.dev/ckpt/$v.safetensors" "$DRAFTS/$v/model.safetensors" \
        || { log "no .dev/ckpt/$v.safetensors: carry .dev/ckpt in this call"; fails+=(drafts); }
    done
    # the build stops FLASHINFER_PACK_SECONDS before the call's deadline and packs what it built (flashinfer.sh exit 4),
    # so a build longer than one call comes back in parts instead of being lost to the call's timeout
    local build=$(( $(left) - ${FLASHINFER_PACK_SECONDS:-45} )) frc
    [ "$build" -ge 30 ] || build=30
    SITE=$SITE OUT=$STAGE/flashinfer FI_BUILD_SECONDS=$build bash "$ROOT/benchmarks/device/flashinfer.sh" 2>&1
    frc=$?
    if [ "$frc" = 4 ]; then
      log "flashinfer: the build reached this call's deadline; the JIT cache so far comes back: put it at" \
        ".dev/flashinfer/jit_cache.tar.gz and run 'bash benchmarks/device/backends.sh flashinfer' again"; rc=4
    elif [ "$frc" != 0 ]; then fails+=(flashinfer); fi
    if [ -f "$STAGE/flashinfer/jit_cache.tar.gz" ]; then
      mv "$STAGE/flashinfer/jit_cache.tar.gz" "$RET/" && modules_sum "$CACHE" > "$BW/jit_cache.sum"
    fi
  fi
  if has model && enough model 60; then
    fresh "$DRAFTS/lilicorr/model.safetensors"
    LILICORR_DRAFT=$DRAFTS/lilicorr gpu_check "$STAGE/greedy" model 2>&1 | tail -n 12
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(model)
  fi
  if has greedy && enough greedy "${GREEDY_SECONDS:-420}"; then
    fresh "$W/model/config.json"
    gpu_check "$STAGE/greedy" "${GREEDY_SYSTEMS:-lilicorr}" 2>&1 | tail -n 40
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(greedy_serve)
    gpu_check "$STAGE/greedy" check 2>&1 | tail -n 12
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(greedy_check)
  fi
  if has t1 && enough t1 "${T1_SECONDS:-420}"; then
    fresh "$W/model/config.json"
    # collecting 4 x 2,000 requests took over 240 s (gpu_check.sh's SAMPLING_SECONDS) on flashinfer
    SAMPLING_SECONDS=${SAMPLING_SECONDS:-300} SAMPLING_SYSTEMS=${T1_SYSTEMS:-lilicorr} SAMPLING_TAU_SEEDS=${SAMPLING_TAU_SEEDS-} gpu_check "$STAGE/t1" sampling 2>&1 | tail -n 20
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(t1)
    local d=$W/sampling_${ATTN}_$SAMP
    [ "$ATTN $SAMP" = "triton pytorch" ] && d=$W/sampling
    cp "$d"/*.log "$STAGE/t1/" 2>/dev/null
  fi
  if has speed; then
    fresh "$DRAFTS/dflash/model.safetensors"
    # shellcheck disable=SC2086
    speed_step --attention-backend "$ATTN" --sampling-backend "$SAMP" speed --systems base dflash builtin lilicorr \
      --rounds "${SPEED_ROUNDS:-5}" --profile-steps 0 ${SPEED_ARGS:-} || fails+=(speed)
  fi
  if has triton-speed; then
    fresh "$DRAFTS/dflash/model.safetensors"
    # the kit's Triton servers as every earlier Triton run served them: flashinfer installed here, but not picked
    # shellcheck disable=SC2086
    SGLANG_IS_FLASHINFER_AVAILABLE=false speed_step speed --systems base dflash builtin lilicorr \
      --concurrency ${TRITON_CONCURRENCY:-1} --rounds "${SPEED_ROUNDS:-5}" --profile-steps 0 || fails+=(triton-speed)
  fi
  bash "$ROOT/benchmarks/device/sglang_jit.sh" pack "$RET"  # where this call's servers built modules (which ones, when)
  log "done; failed: ${fails[*]:-none}; $(left) s to the deadline"
  [ ${#fails[@]} = 0 ] || return 1
  return "$rc"
}

run_steps 2>&1 | tee "$STAGE/calls/$(date +%H%M%S)_${STEPS//,/+}.log"
rc=${PIPESTATUS[0]}
# the JIT cache again where serving built modules the warm-up had not (flashinfer.sh's call returned it already)
if [ -f "$BW/jit_cache.sum" ] && [ ! -f "$RET/jit_cache.tar.gz" ] && [ "$(modules_sum "$CACHE")" != "$(cat "$BW/jit_cache.sum")" ]; then
  SITE=$SITE CACHE=$CACHE bash "$ROOT/benchmarks/device/flashinfer_cache.sh" pack "$RET/jit_cache.tar.gz" \
    && modules_sum "$CACHE" > "$BW/jit_cache.sum" \
    && log "the flashinfer JIT cache grew while serving: -> \$OUT/jit_cache.tar.gz (carry it as .dev/flashinfer/jit_cache.tar.gz)"
fi
tar -czf "$RET/results.tar.gz" -C "$STAGE" .
# a file over 15 MB comes back in parts of 12 MB (16 MiB a file at most): cat FILE.part_* > FILE
find "$RET" -maxdepth 1 -type f -size +15M | while read -r f; do split -b 12000000 -d "$f" "$f.part_" && rm "$f"; done
ls -l "$RET"
exit "$rc"
