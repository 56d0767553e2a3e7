#!/bin/bash
# GPU proof of the LILICORR plugin: SmolLM2-135M-Instruct served by SGLang 0.5.23 with
# --speculative-algorithm LILICORR and a LiLiCorr draft (random by default), loaded by the device
# toolkit (/work/shared/device, README "Real model"). Same two-call structure as .dev/bin/smol.sh
# (the GGUF travels in two parts: 64 MiB carry limit per call), back to back on one warm machine.
#
# CPU side, once, from the project root:   bash ../shared/device/prepare.sh --smol
# call 1, carry [".dev/whl", ".dev/pkgs", ".dev/bin", ".dev/manifest.txt", ".dev/smolA"], timeout_s 300:
#     bash benchmarks/device/gpu_check.sh install
#   (carry also ".dev/flashinfer_headers", from benchmarks/device/flashinfer_headers.py, for T > 0 verified by rejection sampling)
# call 2 (at once), carry [".dev/smolB", ".dev/bin"], timeout_s 600:
#     bash benchmarks/device/gpu_check.sh model,lilicorr,check
#   (add ",base" after "model" for a no-speculation control server: about 60 s more)
# T > 0 with the shipped draft, one system per call: install (carry .dev/flashinfer_headers too), then
#     SAMPLING_SYSTEMS=base bash benchmarks/device/gpu_check.sh model,sampling          (carry .dev/smolB, .dev/bin; the checkpoints'
#                                                                             weights moved out, as for every .dev/smol* call)
# and with checkpoints/ restored, carry [".dev/bin"]:
#     SAMPLING_SYSTEMS=dflash LILICORR_DRAFT=checkpoints/smollm2-lilicorr bash benchmarks/device/gpu_check.sh draft,sampling
#     SAMPLING_SYSTEMS=lilicorr bash benchmarks/device/gpu_check.sh sampling
#
# Steps (comma-separated, run in this order):
#   install   install.sh (bundle, patches, this project -> its sglang.srt.plugins entry point), keep
#             part_a outside the checkout, check the entry point and import the worker once, and run
#             graph_check.py (our proposal alone, captured in a CUDA graph: replay == eager, timing)
#   model     reassemble + sha256 + convert the GGUF; random 1-layer DFlash draft (toolkit); then the `draft` step
#   draft     a random LiLiCorr head (paper geometry) on that drafter -> $W/lilicorr_draft, or LILICORR_DRAFT=DIR, a
#             trained draft (a folder in the checkout, e.g. checkpoints/smollm2-lilicorr, or an absolute path); the
#             same drafter without its head -> $W/dflash_draft. Alone, in a call after `model`, it serves a trained
#             draft that could not travel beside .dev/smolB (64 MiB)
#   base      server without speculation + the same client -> $OUT/base.json (control, optional)
#   lilicorr  server with LILICORR; gpu_client.py: 56 greedy + 6 T=1 prompts one at a time, then 1, 2,
#             4, 8, 16, 32 concurrent requests mixing T=0 and T=1 -> $OUT/lilicorr.json; its log ->
#             $OUT/lilicorr.log. Draft graphs cover bs <= 16 (GRAPH_BS), so 32 also runs the eager path
#   dflash    the same drafter without its head under --speculative-algorithm DFLASH -> $OUT/dflash.json
#   openai    a server without speculation, then a LILICORR server as a user starts it (LILICORR_T_GT_0=refuse, the
#             default: T > 0 refused without flashinfer), each under `python3 -m benchmarks openai-check` through the
#             `openai` package (LILICORR's problems that the first server has too are SGLang's, not failed): chat and
#             text completions, streamed and not, stop strings, max_tokens, logprobs with top_logprobs, n > 1 and
#             seed, at T = 0 and, where served, T > 0; no token past a stop or max_tokens, finish_reason and
#             matched_stop agreeing, one logprobs entry per token (OPENAI_CHECK) -> $OUT/openai.{json,log};
#             then its greedy replies through the greedy check. With the shipped draft (blocks of several tokens:
#             what a stop or max_tokens must cut), in a call after `model`:
#             LILICORR_DRAFT=checkpoints/smollm2-lilicorr bash benchmarks/device/gpu_check.sh draft,openai
#             carrying .dev/jiter (the image's openai package needs it: `pip download jiter --only-binary :all:
#             --python-version 3.12 --platform manylinux2014_x86_64 --no-deps -d .dev/jiter`)
#   faults    a LILICORR server (64 running requests) under `python3 -m benchmarks faults` for FAULTS_SECONDS (300): 64 clients,
#             mixed lengths, disconnects, over-long and invalid requests; then /health and the KV pool back to empty;
#             the server log must name no traceback and no leak -> $OUT/faults.{log,tar.gz}. FAULTS_MEM (0.3) sets
#             --mem-fraction-static (lower it to share the GPU)
#   sampling  T > 0 exactness (needs the flashinfer headers: carry .dev/flashinfer_headers in the install call): base, DFLASH and
#             LILICORR servers in turn, SAMPLING_N (2000) seeded requests per prompt of benchmarks/served/sampling_prompts.jsonl at
#             T = SAMPLING_T (1), 16 new tokens (benchmarks/served/sampling_exactness.py), then a chi-square test per position
#             of the target's probability integral transform (sampling_exactness check), with each server's
#             verification line and tau at T = 1 through the DFLASH and LILICORR servers on the eval prompts for seeds
#             SAMPLING_TAU_SEEDS ("0 1 2"; empty: none; all 200 prompts, ~5 min a system, or a seeded SAMPLING_TAU_LIMIT of them) -> $OUT/sampling_summary.json
#             over the systems collected so far on the machine. SAMPLING_SYSTEMS ("base dflash lilicorr") splits it over
#             calls: about 3 minutes per system without tau. With LILICORR_DRAFT set to a
#             trained draft, DFLASH serves that drafter without its head (the replay's "argmax block" column)
#   check     `python3 -m benchmarks greedy-check` (float32 teacher-forced target; near-ties within TOL_ULPS=2 bf16
#             ulps of the top logit allowed; byte-equal fraction against base.json) over every greedy response; the log must
#             show our proposal captured in the draft CUDA graph and the draft graph capture itself
# Env: ATTN_BACKEND (triton) and SAMPLING_BACKEND (pytorch): the target's --attention-backend and the
#   --sampling-backend of every server (benchmarks/device/check_lib.sh; flashinfer in either needs benchmarks/device/flashinfer.sh
#   run earlier on the machine; the draft's attention stays triton; summary.txt's "backends:" line names them, and the
#   sampling step keeps another pair's records apart in $SMOL_WORK/sampling_ATTN_SAMPLING; benchmarks/device/backends.sh
#   runs the flashinfer checks),
#   SMOL_WORK (/tmp/smol), DEVICE_SITE (/tmp/site), TIMEOUT (server start limit, 330 s), GRAPH_BS (16),
#   EXTRA_ARGS (appended to the LILICORR server's args), LILICORR_DRAFT (see model),
#   LILICORR_T_GT_0 (allow-greedy here: gpu_client.py sends T = 1 requests, which a server without flashinfer
#   verifies greedily; the check judges only the greedy responses; see sglang_lilicorr/serving/README.md).
# Output in $OUT: {lilicorr,dflash,base,openai}.{json,log}, summary.txt, sampling_summary.json (the sampling step).
# Exit status: 0 when every step asked for passed; 3 when call 2 lands on a fresh machine (redo both).
set -u -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LILICORR_T_GT_0=${LILICORR_T_GT_0:-allow-greedy}
source "$(dirname "${BASH_SOURCE[0]}")/lab.sh"  # ROOT; `python3 -m benchmarks STEP` from any folder
DEV=$ROOT/.dev
B=$DEV/bin
SITE=${DEVICE_SITE:-/tmp/site}
W=${SMOL_WORK:-/tmp/smol}
O=${OUT:-/tmp/lilicorr_out}
S=$O/summary.txt
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
STEPS=${1:-install}
mkdir -p "$O" "$W"
source "$ROOT/benchmarks/device/check_lib.sh"
cd /tmp || exit 1  # outside the checkout: the installed package is the one imported
say "backends: ${BACKEND_ARGS[*]} (the draft's attention: triton)"

if has install; then
  say "== install"
  source "$B/install.sh" > "$W/install.txt" 2>&1; rc=$?
  tee -a "$S" < "$W/install.txt"
  [ $rc = 0 ] || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
  install_flashinfer_headers "$DEV"
  if [ -f "$DEV/smolA/part_a" ]; then cp "$DEV/smolA/part_a" "$W/part_a"
  else say "no .dev/smolA/part_a: carry .dev/smolA in this call"; fails+=(part_a); fi
  python3 -c "from importlib.metadata import entry_points as e; eps=[x.value for x in e(group='sglang.srt.plugins') if x.name=='lilicorr']; print('entry point:', eps); assert eps" 2>&1 | tee -a "$S" || fails+=(entry_point)
  say "import check (first imports take 20-40 s)"
  timeout 240 python3 -c "import gguf, sglang_lilicorr.serving.worker as w, sglang_lilicorr.kernels as k; print('LILICORR worker imports ok:', w.LiLiCorrWorker.__mro__[1].__name__)" \
    2>&1 | tail -n 5 | tee -a "$S" || fails+=(imports)
  say "proposal alone in a CUDA graph (graph_check.py)"
  timeout 180 python3 -m benchmarks graph-check 2>&1 | tail -n 6 | tee -a "$S" || fails+=(graph_check)
else
  use_install gpu_check.sh
fi

if has model; then
  say "== model: reassemble, convert, DFlash draft, LiLiCorr head"
  A=$W/part_a; [ -f "$A" ] || A=$DEV/smolA/part_a
  mkdir -p "$W/gguf"
  if [ -f "$A" ] && [ -f "$DEV/smolB/part_b" ] && cat "$A" "$DEV/smolB/part_b" > "$W/gguf/$GGUF" \
     && (cd "$W/gguf" && sha256sum -c "$DEV/smolB/gguf.sha256"); then
    rm -rf "$W/model" "$W/draft"
    timeout 240 python3 "$B/smol_convert.py" "$W/gguf/$GGUF" "$W/model" 2>&1 | grep -iv "warn\|it/s\]" | tail -n 3
    timeout 60 python3 "$B/random_dflash_draft.py" "$W/draft" 1 0 2>&1 | tail -n 1
    [ -f "$W/model/config.json" ] || fails+=(model)
  else
    say "reassembly failed (part_a: $A; carry .dev/smolB in this call)"; fails+=(model)
  fi
fi

if has model || has draft; then  # the served drafts; `draft` alone rebuilds them in a later call (a trained draft travels then)
  rm -rf "$W/lilicorr_draft" "$W/dflash_draft"
  if [ -n "${LILICORR_DRAFT:-}" ]; then
    D=$LILICORR_DRAFT; [[ $D == /* ]] || D=$ROOT/$D
    cp -r "$D" "$W/lilicorr_draft" && say "serving the trained draft $D"
  else
    timeout 120 python3 -m benchmarks random-head "$W/draft" "$W/lilicorr_draft" 2>&1 | tail -n 2 | tee -a "$S"
  fi
  python3 -c "from benchmarks.served.random_head import vanilla_copy as v; v('$W/lilicorr_draft', '$W/dflash_draft')" \
    && say "the same drafter without its head -> $W/dflash_draft (served by the dflash step)"
  [ -f "$W/lilicorr_draft/model.safetensors" ] || fails+=(draft)
fi

serve() {  # serve NAME PORT CLIENT_ARGS -- SERVER_ARGS: client results in $O/NAME.json, server log in $O/NAME.log
  local name=$1 port=$2 client_args=$3; shift 4
  [ -f "$W/model/config.json" ] || { say "no converted model in $W/model (run the model step)"; return 1; }
  local log=$O/$name.log rc=1
  if start_server "$name" "$port" "$log" --model-path "$W/model" \
    "${BACKEND_ARGS[@]}" --grammar-backend none \
    --mem-fraction-static 0.3 --context-length 2048 --cuda-graph-backend-prefill disabled "$@"; then
    # shellcheck disable=SC2086
    timeout 300 python3 -m benchmarks gpu-client "$port" "$W/model" "$O/$name.json" $client_args 2>&1 \
      | tee -a "$S" && rc=0
  fi
  stop_server
  if [ $rc != 0 ]; then
    { echo "--- $name: first traceback / last lines of $log"; grep -m1 -A40 Traceback "$log" | cut -c1-300
      tail -n 25 "$log" | cut -c1-300; } | tee -a "$S"
  fi
  return $rc
}

if has base; then
  say "== base: no speculation (control)"
  serve base 30010 "--greedy 56 --sampled 2 --concurrency 8 --no-spec" -- --max-running-requests 32 \
    --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" || fails+=(base)
fi

if has lilicorr; then
  say "== lilicorr: --speculative-algorithm LILICORR"
  serve lilicorr 30011 "" -- --max-running-requests 32 --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" \
    --speculative-algorithm LILICORR --speculative-draft-model-path "$W/lilicorr_draft" \
    --speculative-draft-attention-backend triton "${EXTRA[@]}" || fails+=(lilicorr)
  grep -E "LILICORR|LiLiCorr|Capture draft|Capture target|non-greedy" "$O/lilicorr.log" | cut -c1-300 | head -n 30 | tee -a "$S"
  # SGLang's own warning (srt/utils/triton_load_watch.py); serving/target_warmup.py compiles its prefill kernel's variants
  say "Triton compiles after serving started: $(grep -c "to compile after serving started" "$O/lilicorr.log" 2>/dev/null)" \
    "(SGLang's prefill kernel _fwd_kernel: $(grep -c "'_fwd_kernel' took" "$O/lilicorr.log" 2>/dev/null))"
fi

if has dflash; then
  say "== dflash: the same drafter, --speculative-algorithm DFLASH (its argmax block)"
  serve dflash 30012 "" -- --max-running-requests 32 --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" \
    --speculative-algorithm DFLASH --speculative-draft-model-path "$W/dflash_draft" \
    --speculative-draft-attention-backend triton || fails+=(dflash)
fi

if has openai; then
  say "== openai: the OpenAI API without speculation, then through LILICORR (python3 -m benchmarks openai-check)"
  # the kit's openai package imports jiter, which the image lacks: a carried .dev/jiter wheel goes into the site
  python3 -c "import jiter" 2>/dev/null || for w in "$DEV"/jiter/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" "$SITE"; done
  if start_server openai_base 30016 "$O/openai_base.log" --model-path "$W/model" "${BACKEND_ARGS[@]}" \
    --grammar-backend none --mem-fraction-static 0.3 --context-length 2048 --cuda-graph-backend-prefill disabled \
    --max-running-requests 32 --cuda-graph-max-bs-decode "${GRAPH_BS:-16}"; then
    timeout 420 python3 -m benchmarks openai-check --url http://127.0.0.1:30016 --tokenizer "$W/model" \
      --out "$O/openai_base.json" --problems-out "$O/openai_base_problems.json" 2>&1 | tail -n 8 | tee -a "$S"
  fi
  stop_server
  [ -s "$O/openai_base_problems.json" ] || { say "no run without speculation to compare with"; fails+=(openai_base); }
  if LILICORR_T_GT_0=refuse start_server openai 30015 "$O/openai.log" --model-path "$W/model" "${BACKEND_ARGS[@]}" \
    --grammar-backend none --mem-fraction-static 0.3 --context-length 2048 --cuda-graph-backend-prefill disabled \
    --max-running-requests 32 --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" --speculative-algorithm LILICORR \
    --speculative-draft-model-path "$W/lilicorr_draft" --speculative-draft-attention-backend triton "${EXTRA[@]}"; then
    timeout 420 python3 -m benchmarks openai-check --url http://127.0.0.1:30015 --tokenizer "$W/model" \
      --out "$O/openai.json" --against "$O/openai_base_problems.json" 2>&1 | tail -n 60 | tee -a "$S"
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(openai)
  else
    fails+=(openai)
  fi
  stop_server
  if [ -s "$O/openai.json" ]; then
    timeout 300 python3 -m benchmarks greedy-check "$W/model" "$O/openai.json" --tol-ulps "${TOL_ULPS:-2}" 2>&1 \
      | grep -v "Loading weights\|Warning" | tail -n 20 | tee -a "$S"
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(openai_greedy)
  fi
fi

if has faults; then
  say "== faults: LILICORR under load and faults for ${FAULTS_SECONDS:-300} s (the lab's faults step, 64 clients)"
  L=$O/faults.log; F=$W/faults; rm -rf "$F"
  if start_server faults 30013 "$L" --model-path "$W/model" "${BACKEND_ARGS[@]}" \
    --grammar-backend none --mem-fraction-static "${FAULTS_MEM:-0.3}" --context-length 2048 --cuda-graph-backend-prefill disabled \
    --max-running-requests 64 --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" --speculative-algorithm LILICORR \
    --speculative-draft-model-path "$W/lilicorr_draft" --speculative-draft-attention-backend triton "${EXTRA[@]}"; then
    timeout $(( ${FAULTS_SECONDS:-300} + 300 )) python3 -m benchmarks faults --url http://127.0.0.1:30013 \
      --clients 64 --duration "${FAULTS_SECONDS:-300}" --expect-spec --out "$F" 2>&1 | tail -n 20 | tee -a "$S"
    [ "${PIPESTATUS[0]}" = 0 ] || fails+=(faults)
  else
    fails+=(faults)
  fi
  stop_server
  say "server log: $(grep -c Traceback "$L") tracebacks, $(grep -ci "leak" "$L") lines naming a leak"
  grep -qi "leak\|Traceback" "$L" && fails+=(faults_log)
  [ -d "$F" ] && tar -czf "$O/faults.tar.gz" -C "$W" faults
fi

if has sampling; then  # needs the flashinfer headers (install step with .dev/flashinfer_headers carried)
  say "== sampling: T = ${SAMPLING_T:-1} exactness, ${SAMPLING_N:-2000} seeded requests per prompt, base / dflash / lilicorr"
  D=$W/sampling; [ "${BACKEND_ARGS[*]}" = "--attention-backend triton --sampling-backend pytorch" ] \
    || D=$W/sampling_${ATTN_BACKEND}_$SAMPLING_BACKEND  # another pair's records are never checked together
  mkdir -p "$D"
  for n in ${SAMPLING_SYSTEMS:-base dflash lilicorr}; do
    case $n in
      base) SPEC=() ;;
      dflash) SPEC=(--speculative-algorithm DFLASH --speculative-draft-model-path "$W/dflash_draft" --speculative-draft-attention-backend triton) ;;
      lilicorr) SPEC=(--speculative-algorithm LILICORR --speculative-draft-model-path "$W/lilicorr_draft" --speculative-draft-attention-backend triton) ;;
    esac
    # refuse-start: a LILICORR server that could only verify T > 0 greedily does not start
    if LILICORR_T_GT_0=refuse-start start_server "sampling_$n" 30014 "$D/$n.log" --model-path "$W/model" "${BACKEND_ARGS[@]}" \
      --grammar-backend none --mem-fraction-static 0.3 --context-length 4096 \
      --cuda-graph-backend-prefill disabled --max-running-requests 32 --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" "${SPEC[@]}"; then
      grep -m2 -E "LILICORR verification|non-greedy verification" "$D/$n.log" | cut -c1-300 | tee -a "$S"
      timeout "${SAMPLING_SECONDS:-240}" python3 -m benchmarks sampling-exactness collect --url http://127.0.0.1:30014 \
        --system "$n" --prompts "$ROOT/benchmarks/served/sampling_prompts.jsonl" --tokenizer "$W/model" --requests "${SAMPLING_N:-2000}" \
        --max-new-tokens 16 --temperature "${SAMPLING_T:-1}" --out "$D/$n.jsonl" 2>&1 | tail -n 2 | tee -a "$S"
      [ "${PIPESTATUS[0]}" = 0 ] || fails+=("sampling_$n")
      if [ "$n" != base ] && [ -n "${SAMPLING_TAU_SEEDS-0 1 2}" ]; then  # tau at T = 1 through the server, eval prompts
        # shellcheck disable=SC2086
        timeout 300 python3 -m sglang_lilicorr.cli bench run --url http://127.0.0.1:30014 --system "$n" \
          --dataset "$ROOT/benchmarks/testbed/eval_prompts.jsonl" ${SAMPLING_TAU_LIMIT:+--limit "$SAMPLING_TAU_LIMIT"} --results "$D/tau_t1.jsonl" --concurrency 32 --temperature 1 \
          --seeds ${SAMPLING_TAU_SEEDS-0 1 2} --max-tokens 256 --warmup 0 --no-progress 2>&1 | tail -n 2 | tee -a "$S"
        [ "${PIPESTATUS[0]}" = 0 ] || fails+=("tau_t1_$n")
      fi
    else
      grep -m1 -A20 Traceback "$D/$n.log" | cut -c1-300 | tee -a "$S"; fails+=("sampling_$n")
    fi
    stop_server
  done
  R=(); X=(); for n in base dflash lilicorr; do [ -s "$D/$n.jsonl" ] && R+=("$D/$n.jsonl") && X+=(--startup-log "$n=$D/$n.log"); done
  [ -s "$D/tau_t1.jsonl" ] && X+=(--tau-records "$D/tau_t1.jsonl")
  timeout 600 python3 -m benchmarks sampling-exactness check "$W/model" "${R[@]}" "${X[@]}" --out "$O/sampling_summary.json" 2>&1 \
    | grep -v "Loading weights\|Warning" | tail -n 6 | tee -a "$S"
  [ "${PIPESTATUS[0]}" = 0 ] || fails+=(sampled_check)
fi

if has check; then
  say "== check"
  R=(); for n in lilicorr dflash base; do [ -s "$O/$n.json" ] && R+=("$O/$n.json"); done
  BASE=(); [ -s "$O/base.json" ] && BASE=(--baseline "$O/base.json")
  if ((${#R[@]})) && [ -f "$W/model/config.json" ]; then
    timeout 300 python3 -m benchmarks greedy-check "$W/model" "${R[@]}" "${BASE[@]}" --tol-ulps "${TOL_ULPS:-2}" 2>&1 \
      | grep -v "Loading weights\|Warning" | tail -n 80 | tee -a "$S"
    grep -q "GREEDY_CHECK PASS" "$S" || fails+=(greedy_check)
  else
    say "nothing to check (no results in $O or no model in $W/model)"; fails+=(greedy_check)
  fi
  L=$O/lilicorr.log
  if grep -q "captured together in the draft CUDA graph" "$L" 2>/dev/null && grep -q "Capture draft verify CUDA graph end" "$L"; then
    say "DRAFT_GRAPH_CHECK PASS: LiLiCorr proposal captured in the draft CUDA graph"
  else
    say "DRAFT_GRAPH_CHECK FAIL: no draft-graph capture of the LiLiCorr proposal in $L"; fails+=(draft_graph)
  fi
  grep -q "CLIENT_CHECK PASS" "$S" || fails+=(client_check)
fi
say "done; failed: ${fails[*]:-none}"
[ ${#fails[@]} = 0 ]
