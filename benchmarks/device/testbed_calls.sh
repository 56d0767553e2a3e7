#!/bin/bash
# The device calls of a SmolLM2 training session on one host with 2 GPUs (nvidia-h100-x2), back to back on one
# warm machine (benchmarks/device/README.md, "Training the SmolLM2 drafts"). Each call: bash benchmarks/device/testbed_calls.sh CALL.
#   install  carry .dev/{whl,pkgs,bin,manifest.txt,smolA}: the device kit, this project, part_a of the GGUF; on an
#            H100 or H200 also benchmarks/device/select_check.sh (the select's digests against the reference, head_bench;
#            ~190 s of the call on an H200: SELECT_CHECK=0 leaves it out where the select's code is unchanged)
#   data     carry .dev/{smolB,bin}: the target (bf16), the sweep choice of benchmarks/results/testbed/h200x4_3f0f2a6,
#            then `data` for DATA_MINUTES (the set closes at what was generated); the set comes back as
#            dataset.tar.gz.part_* (cat them into .dev/eq_data/dataset.tar.gz: eq-train's carried data)
#   train    carry .dev/ckpt (the shipped drafts' weights): both variants from the shipped drafts (`train --init`),
#            one GPU each, for TRAIN_MINUTES; beside them on GPU 1 the evaluation outputs (`evalgen`); then `wait`
#   measure  `export`; on GPU 0 `speed` (SPEED_ARGS, default "--tau-check --concurrency 8 --rounds 3": tau through the
#            servers on every set, one paired concurrency);
#            beside it on GPU 1 `replay` and the served greedy check of the new
#            LiLiCorr draft (benchmarks/device/gpu_check.sh lilicorr,check)
# The shipped drafts' served speed (one GPU, nvidia-h100-x1): `install`, then
#   model    carry .dev/{smolB,bin}: the target (bf16)
#   speed    carry .dev/ckpt: the shipped drafts as WORK/drafts, then `speed $SPEED_ARGS` on GPU 0. The whole benchmark is
#            three speed calls back to back (a setting's calls add up; each stops its rounds before the deadline):
#              SPEED_ARGS="--concurrency 1"                           ~470 s on an H200 (cold start-up, six servers, 3 rounds)
#              SPEED_ARGS="--concurrency 4 8 16 32 --profile-steps 0" ~510 s
#              SPEED_ARGS="--setting graphs16 --profile-steps 0"      ~290 s (c = 32 on the eager path)
#            The eager cell alone, >= 5 paired rounds of the four summarized systems (--systems: no verify variants, four
#            servers start; a setting's calls must all name the same systems, so on a machine whose /tmp/testbed holds
#            graphs16 rounds of another set it is refused: a fresh machine, or rm -r /tmp/testbed/speed/graphs16 first):
#              CALL_SECONDS=560 SPEED_ARGS="--setting graphs16 --rounds 6 --profile-steps 0 --systems base dflash builtin lilicorr"
#            then on the CPU machine `python -m benchmarks serve-speed --graphs DIR/graphs32 --eager
#            DIR/graphs16 --card CARD --commit C --out benchmarks/results/serve-speed/CARD_COMMIT` (benchmarks/README.md)
#            The adaptive verify width at c = 1-64 on both prompt sets (benchmarks/device/README.md, "The adaptive
#            verify width, served"): three speed calls with the same SPEED_ARGS (each resumes where the last stopped):
#              CALL_SECONDS=570 SPEED_ARGS="--setting graphs64 --prompt-set writing eval --rounds 3 --profile-steps 0
#                --greedy-check --systems base dflash builtin lilicorr lilicorr_fixed"
#            then on the CPU machine `python -m benchmarks adaptive-summary --writing DIR/graphs64 --eval
#            DIR/graphs64_eval --card CARD --commit C --out benchmarks/results/adaptive`
#   startup  carry .dev/ckpt: the shipped drafts, then `startup $STARTUP_ARGS` (default: LILICORR and the built-in, 3 cold
#            starts each, one server at a time; ~70 + 45 s a pair on an H200, estimated): startup.json, startup.md
# The long-input lineage (one GPU is enough): `install`, `data`, then
#   long-train    carry .dev/ckpt: the conversations packed to >= 3,584 tokens in /tmp/testbed_long (long-pack), the
#                 LiLiCorr draft trained on them from the shipped one in both objectives (lilicorr, margin: variants.LONG,
#                 max_length 4096, YaRN x2), side by side (sharing the GPU where there is one), TRAIN_MINUTES (6) each
#   long-measure  `export` (the shipped DFlash draft beside the long drafts), then `long-serve`: each long draft, SGLang's
#                 DFLASH and no speculation at 1,024 / 4,096 / 7,936 input tokens, tau, tokens/s, failures (errors and
#                 the fp32 check), every not-argmax token's deficit -> long/summary.json, not_argmax.jsonl, records.jsonl.
#                 Drafts of an earlier run instead (a fresh machine after `install` and `model`): carry .dev/long holding
#                 draft_NAME.tar files (as `export` writes them; dflash among them): they are unpacked, nothing trained
# The equal-budget comparison (docs/BASELINES.md), on nvidia-h200-x4 (x2 works, slower: two runs per GPU):
# `install` (add .dev/flashinfer_headers to its carry: T = 1 through the servers needs it), `DATA_SEED=3 data`, then
#   eq-train    carry .dev/ckpt (its dflash.safetensors is enough): dflash, lilicorr, domino and dspark from the shipped DFlash draft (`train --init-draft`),
#               EQ_STEPS (400) optimizer steps each at the paper's global batch of 64 (the sweep's 32 x 2 micro-steps),
#               the GPUs split among them; evalgen beside them on the last GPU; then `wait`
#   eq-measure  `wait`, `export`; then at once: `compare --parts rounds` (paired tokens/s, c = 1 8 32) on GPU 0,
#               `compare --parts tau` (tau through the servers, T = 0 and T = 1 x seeds 0 1 2) on GPU 1, and `replay`
#               of the four drafts on the GPUs from 2 (GPU 1 on x2). A part cut by the deadline resumes: run the call again
# Estimated seconds on x4 (from ../h200x2_5ff6f18 and the speed calls): install ~150, DATA_MINUTES=2.5 data ~480
# (CALL_SECONDS=500), eq-train ~450 (4 x 400 steps at ~0.3 s, evals, evalgen), eq-measure ~560 (CALL_SECONDS=570: five
# servers' cold start ~180 s, then rounds / served tau / replay side by side): ~27 of the session's 30 minutes. On x2
# the runs share GPUs (~0.6 s a step): eq-train leaves them running, eq-measure's `wait` may use its call, and a second
# eq-measure call (same machine) finishes compare: past 30 minutes, so x2 needs EQ_STEPS=250.
# Then on the CPU machine `python -m benchmarks baselines-summary` over tau.json and the compare bundles.
# The 4x budget (EQ_BUDGET=4: EQ_STEPS x 4 optimizer steps each, each system on its own GPU; 4 GPUs or more, else
# refused), on the same data, in a session of its own on nvidia-h200-x4: `install`, `model`, then `EQ_BUDGET=4
# eq-train` carrying also .dev/eq_data (the 1x session's data call's dataset.tar.gz: no data call; without it, run
# `DATA_SEED=3 data` first and the summary records other data), then `WAIT_MINUTES=6 CALL_SECONDS=570 eq-measure`
# (WAIT_MINUTES, default 4: eq-measure's wait for the runs). Estimated: install ~150, model ~60, eq-train ~570 (1,600
# steps at the sweep's ~0.29 s and 4 evals of ~19 s: ~530-600 s a run; one slower goes on after the call),
# eq-measure ~570 (what is left of the runs, then compare and replay as at x1; a part cut by the deadline resumes in
# a second call): ~24 minutes with the machine's start. Then
# `baselines-summary --budget-x 4` (docs/BASELINES.md).
# The paper recipe and the head-width comparison on one GPU (nvidia-h100-x1; checkpoints/README.md, "Next"), in
# /tmp/testbed_paper: `install` (SELECT_CHECK=0), then
#   paper-data     carry .dev/{smolB,bin}: the target, then `--paper-recipe data` (replies up to 2,048 tokens in pieces,
#                  cut where they loop; DATA_SEED 3, DATA_MINUTES 4, MAGPIE 60000, PACKAGE 12000 planned), tokenized
#                  at 3,072; then `evalgen`. A second call adds to the set (train.jsonl is then rewritten: before training)
#   paper-train    carry .dev/ckpt: lilicorr (head width 256) and lilicorr_w1024 (the paper's head) from the shipped
#                  DFlash draft (`train --init-draft`; PAPER_VARIANTS names others, e.g. adds dflash), side by side,
#                  global batch 64 (16 x 4 micro-steps),
#                  EPOCHS (3) over the data, held-out tau and a checkpoint every EVAL_TOKENS (2e6) training tokens, each
#                  run ending itself, checkpointed, after TRAIN_CAP (16) minutes; then `wait`. The runs go on after the
#                  call; a later call restarts a run whose process ended before its last step (it resumes)
#   paper-measure  `wait` (WAIT_MINUTES 3), `export` (the runs' newest checkpoints), `replay` of both widths and the
#                  shipped DFlash draft on REPLAY_OUTPUTS (outputs_T0_s0.jsonl), `tables` (the learning curves). The
#                  width-256 draft comes back in parts; the width-1024 one (about 63 MiB) stays: its tau and curves come
# What comes back: at most 8 files (the device's limit): results.tar.gz holds everything small, large files come in
# parts of 12 MB (cat PART_* > FILE), and sglang_jit.tar.gz where the call's servers built SGLang JIT kernels
# (benchmarks/device/sglang_jit.sh: keep it as .dev/sglang_jit/sglang_jit.tar.gz and carry it in the first call that starts
# servers and has the room: train, eq-train, speed, startup; install and data have none). Every call sets
# TESTBED_DEADLINE from CALL_SECONDS (570): the testbed's steps read it from the environment (the one setting they take
# that way), so a step that would not finish exits 4. CALLS_WORK (/tmp/calls): each call's staging folder;
# TESTBED_WORK (/tmp/testbed): the testbed's work folder; CALLS_INIT (/tmp/init): the shipped drafts trainings start from.
set -u -o pipefail
CALL=${1:?usage: bash benchmarks/device/testbed_calls.sh install|data|train|measure|model|speed|startup|long-train|long-measure|eq-train|eq-measure|paper-data|paper-train|paper-measure}
case $CALL in install|data|train|measure|model|speed|startup|long-train|long-measure|eq-train|eq-measure|paper-data|paper-train|paper-measure) ;;
  *) echo "unknown call $CALL: install, data, train, measure, model, speed, startup, long-train, long-measure, eq-train, eq-measure, paper-data, paper-train or paper-measure" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export TESTBED_DEADLINE=$(( $(date +%s) + ${CALL_SECONDS:-570} )) PYTHONUNBUFFERED=1
RET=${OUT:-/tmp/lilicorr_out}
CALLS=${CALLS_WORK:-/tmp/calls}
INIT=${CALLS_INIT:-/tmp/init}  # the shipped drafts that trainings start from
export TESTBED_WORK=${TESTBED_WORK:-/tmp/testbed}  # the testbed's work folder: testbed.sh passes it as --work
TESTBED=$TESTBED_WORK
export OUT=$CALLS/$CALL  # the steps copy into here; pack() moves it into $RET
rm -rf "$OUT" && mkdir -p "$OUT"
SWEEP=$ROOT/benchmarks/results/testbed/h200x4_3f0f2a6
# servers that share a GPU with training: fixed KV pools instead of a share of the memory
SHARED_SERVER_ARGS="--attention-backend triton --sampling-backend pytorch --grammar-backend none --mem-fraction-static 0.9 \
--max-total-tokens 131072 --context-length 4096 --cuda-graph-max-bs-decode 256 --cuda-graph-backend-prefill disabled"
log() { echo "[calls $CALL $(date +%H:%M:%S)] $*"; }
quiet() { grep -v "it/s\]\|s/it\]\|Loading weights\|Warning" | tail -n "${1:-25}"; }

pack() {  # $OUT -> $RET: files over 15 MB in 12 MB parts, everything else in results.tar.gz; SGLang's JIT builds
  mkdir -p "$RET"
  bash "$ROOT/benchmarks/device/sglang_jit.sh" pack "$RET"
  find "$OUT" -type f -size +15M | while read -r f; do split -b 12000000 -d "$f" "$RET/$(basename "$f").part_" && rm "$f"; done
  tar -czf "$RET/results.tar.gz" -C "$OUT" . && ls -l "$RET"
}
trap pack EXIT
bash "$ROOT/benchmarks/device/sglang_jit.sh" unpack  # once per machine, where a call carries .dev/sglang_jit

sweep_choice() {  # the sweep's depth and batch choice -> $1/sweep (what `train` plans from)
  mkdir -p "$1/sweep" && cp "$SWEEP/depth.json" "$SWEEP/batch.json" "$1/sweep/"
}

shipped_drafts() {  # the shipped drafts (config from the checkout, weights carried in .dev/ckpt) -> $1/<variant>
  for v in ${2:-lilicorr dflash}; do
    mkdir -p "$1/$v" && cp "$ROOT/checkpoints/smollm2-$v/config.json" "$1/$v/" \
      && cp "$ROOT/.dev/ckpt/$v.safetensors" "$1/$v/model.safetensors" || { log "no .dev/ckpt/$v.safetensors: carry .dev/ckpt"; exit 1; }
  done
}

case $CALL in
install)
  bash "$ROOT/.dev/bin/smol.sh" install 2>&1 | tail -n 8
  SITE=${DEVICE_SITE:-/tmp/site} S=$OUT/flashinfer.txt && source "$ROOT/benchmarks/device/check_lib.sh" \
    && install_flashinfer_headers "$ROOT/.dev"  # where .dev/flashinfer_headers was carried
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  if [ "${SELECT_CHECK:-1}" != 0 ] && nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | grep -q "H100\|H200"; then
    bash "$ROOT/benchmarks/device/select_check.sh" "$OUT/select" 0 2>&1 | tail -n 8
  fi
  ;;
data)
  bash "$ROOT/.dev/bin/smol.sh" model 2>&1 | tail -n 4
  sweep_choice $TESTBED
  log "data for ${DATA_MINUTES:-4} minutes"
  bash "$ROOT/benchmarks/device/testbed.sh" data --seed "${DATA_SEED:-1}" --minutes "${DATA_MINUTES:-4}" 2>&1 | quiet 30
  cp $TESTBED/data/logs/*.log "$OUT/" 2>/dev/null
  # the data set itself, in 12 MB parts beside results.tar.gz: another session's eq-train trains on the same data
  mkdir -p "$RET" && tar -czf - -C $TESTBED/data train.jsonl heldout.jsonl manifest.json \
    | split -b 12000000 -d - "$RET/dataset.tar.gz.part_"
  ;;
model)
  bash "$ROOT/.dev/bin/smol.sh" model 2>&1 | tail -n 4
  ;;
speed)
  shipped_drafts $TESTBED/drafts
  bash "$ROOT/benchmarks/device/testbed.sh" speed ${SPEED_ARGS:-} 2>&1 | quiet 60
  ;;
startup)
  shipped_drafts $TESTBED/drafts
  bash "$ROOT/benchmarks/device/testbed.sh" startup ${STARTUP_ARGS:-} 2>&1 | quiet 30
  ;;
train)
  shipped_drafts $INIT
  bash "$ROOT/benchmarks/device/testbed.sh" train lilicorr dflash --minutes "${TRAIN_MINUTES:-7}" --max-minutes "${TRAIN_CAP:-8.3}" \
    --evals "${TRAIN_EVALS:-6}" --init $INIT 2>&1 | quiet
  CUDA_VISIBLE_DEVICES=1 bash "$ROOT/benchmarks/device/testbed.sh" --server-args "$SHARED_SERVER_ARGS" evalgen 2>&1 | quiet
  bash "$ROOT/benchmarks/device/testbed.sh" wait --minutes $(( (TESTBED_DEADLINE - $(date +%s) - 40) / 60 )) 2>&1 | tail -n 4
  ;;
long-train)
  shipped_drafts $INIT && rm -rf $INIT/margin && cp -r $INIT/lilicorr $INIT/margin
  sweep_choice /tmp/testbed_long
  bash "$ROOT/benchmarks/device/testbed.sh" --long --work /tmp/testbed_long long-pack --source $TESTBED 2>&1 | quiet 4
  bash "$ROOT/benchmarks/device/testbed.sh" --long --work /tmp/testbed_long train lilicorr margin --minutes "${TRAIN_MINUTES:-6}" \
    --max-minutes "${TRAIN_CAP:-7.5}" --evals "${TRAIN_EVALS:-4}" --init $INIT 2>&1 | quiet
  bash "$ROOT/benchmarks/device/testbed.sh" --long --work /tmp/testbed_long wait --minutes $(( (TESTBED_DEADLINE - $(date +%s) - 40) / 60 )) 2>&1 | tail -n 4
  ;;
long-measure)
  D=/tmp/testbed_long/drafts && mkdir -p $D
  if compgen -G "$ROOT/.dev/long/draft_*.tar" > /dev/null; then
    for t in "$ROOT"/.dev/long/draft_*.tar; do tar -xf "$t" -C $D || exit 1; done
  else
    bash "$ROOT/benchmarks/device/testbed.sh" --long --work /tmp/testbed_long wait --minutes 2 2>&1 | tail -n 3
    bash "$ROOT/benchmarks/device/testbed.sh" --long --work /tmp/testbed_long export 2>&1 | quiet 6
    rm -rf $D/dflash && cp -r $INIT/dflash $D/dflash
  fi
  ls $D
  bash "$ROOT/benchmarks/device/testbed.sh" --long --work /tmp/testbed_long long-serve 2>&1 | quiet 45
  ;;
eq-train)
  X=${EQ_BUDGET:-1}
  GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  case $X in ''|*[!0-9]*|0) log "EQ_BUDGET=$X: pass a whole number >= 1 (the one-GPU budget's multiple)"; exit 2 ;; esac
  if [ "$X" -gt 1 ] && [ "$GPUS" -lt 4 ]; then
    log "EQ_BUDGET=$X: each of the four systems on its own GPU needs 4, this machine has $GPUS"; exit 2
  fi
  if [ -f "$ROOT/.dev/eq_data/dataset.tar.gz" ]; then  # the data of the other budget's session (a `data` call's return)
    log "the carried data set (.dev/eq_data/dataset.tar.gz) -> $TESTBED/data"
    rm -rf "$TESTBED/data" && mkdir -p "$TESTBED/data" && tar -xzf "$ROOT/.dev/eq_data/dataset.tar.gz" -C "$TESTBED/data" \
      && sweep_choice "$TESTBED" || exit 1
  fi
  shipped_drafts $INIT dflash  # the one draft the four start from (.dev/ckpt/dflash.safetensors is enough)
  log "EQ_BUDGET=$X: $(( ${EQ_STEPS:-400} * X )) optimizer steps each"
  bash "$ROOT/benchmarks/device/testbed.sh" train dflash lilicorr domino dspark --steps $(( ${EQ_STEPS:-400} * X )) --global-batch 64 \
    --init-draft $INIT/dflash --evals "${TRAIN_EVALS:-4}" --minutes 8 --max-minutes "${TRAIN_CAP:-25}" 2>&1 | quiet
  CUDA_VISIBLE_DEVICES=$(( GPUS - 1 )) bash "$ROOT/benchmarks/device/testbed.sh" --server-args "$SHARED_SERVER_ARGS" evalgen 2>&1 | quiet
  bash "$ROOT/benchmarks/device/testbed.sh" wait --minutes $(( (TESTBED_DEADLINE - $(date +%s) - 40) / 60 )) 2>&1 | tail -n 4
  ;;
eq-measure)
  GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  bash "$ROOT/benchmarks/device/testbed.sh" wait --minutes "${WAIT_MINUTES:-4}" 2>&1 | tail -n 3 \
    && bash "$ROOT/benchmarks/device/testbed.sh" export 2>&1 | quiet 8
  bash "$ROOT/benchmarks/device/testbed.sh" replay --drafts dflash lilicorr domino dspark --gpu-ids $(seq $(( GPUS > 2 ? 2 : 1 )) $(( GPUS - 1 ))) \
    > "$CALLS/replay.txt" 2>&1 &
  replay=$!
  bash "$ROOT/benchmarks/device/testbed.sh" compare --parts tau --gpu 1 > "$CALLS/tau.txt" 2>&1 &
  tau=$!
  bash "$ROOT/benchmarks/device/testbed.sh" compare --parts rounds --gpu 0 2>&1 | quiet 40
  wait $tau; quiet 30 < "$CALLS/tau.txt"
  wait $replay; quiet 40 < "$CALLS/replay.txt"
  ;;
paper-data)
  P=/tmp/testbed_paper
  [ -f /tmp/smol/model/config.json ] || bash "$ROOT/.dev/bin/smol.sh" model 2>&1 | tail -n 4
  sweep_choice $P
  log "paper-recipe data for ${DATA_MINUTES:-4} minutes"
  bash "$ROOT/benchmarks/device/testbed.sh" --paper-recipe --work $P data --seed "${DATA_SEED:-3}" --minutes "${DATA_MINUTES:-4}" \
    --max-new-tokens 2048 --magpie "${MAGPIE:-60000}" --package "${PACKAGE:-12000}" 2>&1 | quiet 30
  bash "$ROOT/benchmarks/device/testbed.sh" --work $P evalgen 2>&1 | quiet 8
  ;;
paper-train)
  P=/tmp/testbed_paper
  shipped_drafts $INIT
  bash "$ROOT/benchmarks/device/testbed.sh" --paper-recipe --work $P train ${PAPER_VARIANTS:-lilicorr lilicorr_w1024} --init-draft $INIT/dflash \
    --global-batch 64 --batch-size 16 --epochs "${EPOCHS:-3}" --eval-tokens "${EVAL_TOKENS:-2e6}" --minutes 12 \
    --max-minutes "${TRAIN_CAP:-16}" 2>&1 | quiet
  bash "$ROOT/benchmarks/device/testbed.sh" --work $P wait --minutes $(( (TESTBED_DEADLINE - $(date +%s) - 40) / 60 )) 2>&1 | tail -n 4
  ;;
paper-measure)
  P=/tmp/testbed_paper
  bash "$ROOT/benchmarks/device/testbed.sh" --work $P wait --minutes "${WAIT_MINUTES:-3}" 2>&1 | tail -n 3
  bash "$ROOT/benchmarks/device/testbed.sh" --work $P export 2>&1 | quiet 6
  rm -f "$OUT/draft_lilicorr_w1024.tar"  # ~63 MiB: over what a call brings back beside the rest
  [ -d $INIT/dflash ] && rm -rf $P/drafts/dflash && cp -r $INIT/dflash $P/drafts/dflash
  bash "$ROOT/benchmarks/device/testbed.sh" --work $P replay --drafts ${PAPER_VARIANTS:-lilicorr lilicorr_w1024} dflash \
    --outputs "${REPLAY_OUTPUTS:-outputs_T0_s0.jsonl}" 2>&1 | quiet 30
  cp $P/train_config.json $P/data/manifest.json $P/replay/tau.json "$OUT/" 2>/dev/null
  bash "$ROOT/benchmarks/device/testbed.sh" --work $P tables 2>&1 | quiet 30
  cp $P/results.json $P/tables.md "$OUT/" 2>/dev/null
  ;;
measure)
  bash "$ROOT/benchmarks/device/testbed.sh" wait --minutes 3 2>&1 | tail -n 3 && bash "$ROOT/benchmarks/device/testbed.sh" export 2>&1 | quiet 6
  (
    bash "$ROOT/benchmarks/device/testbed.sh" replay --drafts lilicorr dflash --gpu-ids 1 2>&1 | quiet 40
    rm -rf /tmp/smol/lilicorr_draft && cp -r $TESTBED/drafts/lilicorr /tmp/smol/lilicorr_draft
    CUDA_VISIBLE_DEVICES=1 OUT=$OUT/served bash "$ROOT/benchmarks/device/gpu_check.sh" lilicorr,check 2>&1 | tail -n 12
  ) > "$CALLS/side.txt" 2>&1 &
  side=$!
  bash "$ROOT/benchmarks/device/testbed.sh" speed ${SPEED_ARGS:---tau-check --concurrency 8 --rounds 3} 2>&1 | quiet 60
  wait $side
  cat "$CALLS/side.txt"
  ;;
esac
