#!/bin/bash
# tau THROUGH THE SGLANG SERVER on the testbed's held-out prompts: the shipped drafts served with
# --speculative-algorithm LILICORR (checkpoints/smollm2-lilicorr) and DFLASH (checkpoints/smollm2-dflash,
# the vanilla-trained drafter), plus the target without speculation (base) for speedup, measured by
# `lilicorr bench run` and reported by `lilicorr bench report` (baseline base), next to the reference
# decoder's tau of the same systems on the same prompts (testbed/results/h200_2026-11-26).
#
# Prompts: exactly those of the reference tables' T = 0 cells (the prompts every system finished in
# testbed/results/.../eval, 10 per set), at most PER_SET per set; temperatures TEMPS (T > 0 once per
# seed of SEEDS), MAX_TOKENS new tokens, concurrency CONCURRENCY; chat API (the server applies the chat
# template, as the reference did). The report adds the per-block wall (ms of request latency per
# verification block) of each speculative system and its ratio to dflash's.
#
# Systems: lilicorr, dflash, base, and lilicorr_eager / dflash_eager = the same server with
# --disable-cuda-graph (no CUDA graphs; results are labelled with the variant name).
# Warm-up: before each (c, T, seed) run, `bench run --warmup WARMUP` sends max(WARMUP, c) unrecorded
# requests in waves of c concurrent ones, so every decode batch size 1..c (and SGLang's per-shape
# Triton compiles, ~1.1 s each) is met before timing. Sequential warm-up let the first system on a cold
# machine pay those compiles inside its measured c = 8 phase (H200, 4585638, in git history at
# c745522:benchmarks/results/serve_eval_h200_2026-11-26_run2: lilicorr aime2025 at 397 tok/s vs ~1600 for the later categories); with the waves the SYSTEMS order no longer
# matters for that, and it is kept as given.
# STAGE_TIMING=1: each speculative server runs with LILICORR_STAGE_TIMING=$SERVE_EVAL_WORK/stages/<system>
# (the plugin's stage timer, serving/stage_timer.py, writes stages-<pid>.json there) and
# LILICORR_STAGE_TIMING_BS = the CONCURRENCY values (its micro-benchmark batch sizes). After all phases,
# the systems that wrote files go, per concurrency c and per kind (graph: lilicorr, dflash; eager: the
# _eager variants), to `lilicorr bench stages --timings <system>=<dir> ... --bs c [--eager] --out
# $OUT/stages/c<c>[_eager]` (all calls in one Python process; any failure is listed once as `stages`);
# the raw files are copied to $OUT/stages/raw/<system>/.
#
# GPU machine, after gpu_check.sh's two calls (install; model) on the same warm machine:
#     bash testbed/serve_eval.sh          (one call, timeout_s 600; no carry needed)
# Phases run one server at a time in the order SYSTEMS; each is time-boxed (startup, then the bench
# until the phase's end), so one failing server leaves the others' results. The whole script stays
# within BUDGET seconds: a phase may use what the earlier ones left, minus RESERVE s kept for each
# later phase and 25 s for the report (50 s with STAGE_TIMING=1).
# Env: SYSTEMS ("lilicorr dflash base"), PER_SET (10), MAX_TOKENS (128), CONCURRENCY ("1 8"),
#   TEMPS ("0"), SEEDS ("0"), WARMUP (2), STAGE_TIMING (0),
#   BUDGET (520), RESERVE (110), GRAPH_BS (16), PORT0 (30020: ports PORT0, PORT0 + 1, ...),
#   SMOL_WORK (/tmp/smol), DEVICE_SITE (/tmp/site),
#   PYTHON (python3), SERVE_EVAL_WORK (/tmp/serve_eval; its results are cleared first unless RESUME=1),
#   SERVE_EVAL_LAUNCH: a command that serves $PORT (env SYSTEM, PORT, SERVER_ARGS = the speculative
#   flags SGLang would get, LILICORR_STAGE_TIMING[_BS]) instead of SGLang (CPU tests).
# Output in $OUT (<= 8 files at one temperature, +3 plots per further temperature): report.md +
# summary.json (bench report), its plots (<= 3 png per temperature, when matplotlib is there),
# tau_server_vs_reference.md, results.jsonl (every system's bench records), serve_eval.txt (this log; a
# failed server's traceback / last lines); with STAGE_TIMING=1 also stages/: c<c>[_eager]/ (stages.md,
# .png, .json) per concurrency and kind, and raw/<system>/stages-<pid>.json.
set -u -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SITE=${DEVICE_SITE:-/tmp/site}
MODEL=${SMOL_WORK:-/tmp/smol}/model
W=${SERVE_EVAL_WORK:-/tmp/serve_eval}
O=${OUT:-/tmp/serve_eval_out}
PY=${PYTHON:-python3}
REF=$ROOT/testbed/results/h200_2026-11-26
S=$O/serve_eval.txt
read -r -a SYS <<< "${SYSTEMS:-lilicorr dflash base}"
read -r -a CONC <<< "${CONCURRENCY:-1 8}"
read -r -a TEMPS_A <<< "${TEMPS:-0}"
read -r -a SEEDS_A <<< "${SEEDS:-0}"
STAGE_TIMING=${STAGE_TIMING:-0}
TAIL=25; [ "$STAGE_TIMING" = 1 ] && TAIL=50  # seconds kept for the report (and the stage tables)
T0=$SECONDS
END=$((T0 + ${BUDGET:-520}))
mkdir -p "$O" "$W"
say() { echo "[t+$((SECONDS - T0))s] $*" | tee -a "$S"; }
cd /tmp || exit 1  # not the checkout: its plain sglang_lilicorr/ would shadow the installed package

if [ -z "${SERVE_EVAL_LAUNCH:-}" ]; then
  if [ ! -f "$SITE/.device_manifest" ] || [ ! -f "$MODEL/config.json" ]; then
    echo "serve_eval.sh: no install in $SITE or no model in $MODEL: run gpu_check.sh install, then its model step, on this warm machine first." >&2
    exit 3
  fi
  case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
  export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
fi
"$PY" -c "import sglang_lilicorr.benchmarks.prompt_file" 2>/dev/null || {
  echo "serve_eval.sh: the installed sglang_lilicorr predates prompt files (benchmarks/prompt_file.py): rerun gpu_check.sh install with this checkout." >&2
  exit 3; }

[ "${RESUME:-0}" = 1 ] || rm -rf "$W"/*.jsonl "$W/stages"  # RESUME=1: a rerun completes the missing prompts

# --- prompts: the reference tables' T = 0 prompts (every system finished them), <= PER_SET per set
PROMPTS=$W/testbed_eval.jsonl  # the dataset is named after the stem: testbed_eval
"$PY" - "$ROOT/testbed/eval_prompts.jsonl" "$REF/eval" "${PER_SET:-10}" "$PROMPTS" <<'EOF' 2>&1 | tee -a "$S" || exit 1
import collections, glob, json, sys
src, ref_dir, per_set, dst = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(line) for line in open(src) if line.strip()]
done = collections.defaultdict(set)
for path in glob.glob(f"{ref_dir}/results-*.jsonl"):
    for line in open(path):
        r = json.loads(line)
        if r["temperature"] == 0:
            done[r["system"]].add(r["prompt_id"])
common = set.intersection(*done.values()) if done else {r["id"] for r in rows}
taken = collections.Counter()
keep = []
for r in rows:
    if r["id"] in common and taken[r["set"]] < per_set:
        taken[r["set"]] += 1
        keep.append(r)
open(dst, "w").write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
print(f"{len(keep)} prompts ({dict(taken)}) -> {dst}" + ("" if done else f" (no reference results in {ref_dir}: first {per_set} per set)"))
EOF

# --- one server at a time
LIVE=""
stop_server() {  # the server's whole process group: TERM, up to 20 s, then KILL
  [ -n "$LIVE" ] || return 0
  kill -TERM -- -"$LIVE" 2>/dev/null
  for _ in $(seq 20); do
    ps -eo pgid=,stat= | awk -v g="$LIVE" '$1 == g && $2 !~ /^Z/ {f = 1} END {exit !f}' || break
    sleep 1
  done
  kill -KILL -- -"$LIVE" 2>/dev/null; wait "$LIVE" 2>/dev/null
  LIVE=""
}
trap stop_server EXIT
trap 'stop_server; exit 143' TERM INT

launch() {  # launch NAME PORT LOG: starts the server in its own process group, sets LIVE
  local name=$1 port=$2 log=$3 spec=() stage=()
  case $name in
    lilicorr|lilicorr_eager) spec=(--speculative-algorithm LILICORR --speculative-draft-model-path "$ROOT/checkpoints/smollm2-lilicorr"
                    --speculative-draft-attention-backend triton) ;;
    dflash|dflash_eager) spec=(--speculative-algorithm DFLASH --speculative-draft-model-path "$ROOT/checkpoints/smollm2-dflash"
                  --speculative-draft-attention-backend triton) ;;
    base) ;;
    *) say "unknown system $name (lilicorr, dflash, base, lilicorr_eager or dflash_eager)"; return 1 ;;
  esac
  [ "$name" = "${name%_eager}" ] || spec+=(--disable-cuda-graph)
  if [ "$STAGE_TIMING" = 1 ] && ((${#spec[@]})); then
    mkdir -p "$W/stages/$name" && stage=(LILICORR_STAGE_TIMING="$W/stages/$name" LILICORR_STAGE_TIMING_BS="$(IFS=,; echo "${CONC[*]}")")
  fi
  if [ -n "${SERVE_EVAL_LAUNCH:-}" ]; then
    SYSTEM=$name PORT=$port SERVER_ARGS="${spec[*]}" env "${stage[@]}" setsid bash -c "$SERVE_EVAL_LAUNCH" > "$log" 2>&1 &
  else
    env "${stage[@]}" setsid "$PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$port" \
      --attention-backend triton --sampling-backend pytorch --grammar-backend none --mem-fraction-static 0.3 \
      --context-length 2048 --cuda-graph-backend-prefill disabled --max-running-requests 32 \
      --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" "${spec[@]}" > "$log" 2>&1 &
  fi
  LIVE=$!
}

phase() {  # phase NAME PORT LATER: server up, bench until the phase's end, server down
  local name=$1 port=$2 later=$3 log=$W/$1.log up=0 t=$SECONDS rc=1
  local phase_end=$((END - TAIL - later * ${RESERVE:-110}))
  say "== $name: phase until t+$((phase_end - T0))s"
  launch "$name" "$port" "$log" || return 1
  while (( SECONDS < phase_end - 15 )); do
    kill -0 "$LIVE" 2>/dev/null || { say "$name: server exited during startup"; break; }
    curl -sf -m 2 "http://127.0.0.1:$port/health" > /dev/null 2>&1 && { up=1; break; }
    sleep 2
  done
  say "$name: startup $((SECONDS - t)) s, up=$up"
  if [ $up = 1 ]; then
    timeout $((phase_end - SECONDS > 10 ? phase_end - SECONDS : 10)) "$PY" -m sglang_lilicorr.benchmarks.cli bench run --url "http://127.0.0.1:$port" \
      --system "$name" --dataset "$PROMPTS" --results "$W/$name.jsonl" --concurrency "${CONC[@]}" --temperature "${TEMPS_A[@]}" \
      --seeds "${SEEDS_A[@]}" --warmup "${WARMUP:-2}" --max-tokens "${MAX_TOKENS:-128}" --request-timeout 60 --no-progress 2>&1 \
      | tail -n 5 | tee -a "$S"
    rc=$?
    [ $rc = 124 ] && say "$name: bench stopped at the phase's end (results so far are kept)"
    say "$name: $(wc -l < "$W/$name.jsonl" 2>/dev/null || echo 0) prompt records in $((SECONDS - t)) s"
  fi
  stop_server
  if [ $rc != 0 ]; then
    { echo "--- $name: first traceback / last lines of its server log"; grep -m1 -A30 Traceback "$log" | cut -c1-300
      tail -n 15 "$log" | cut -c1-300; } | tee -a "$S"
  fi
  return $rc
}

fails=()
for i in "${!SYS[@]}"; do
  phase "${SYS[$i]}" $((${PORT0:-30020} + i)) $((${#SYS[@]} - i - 1)) || fails+=("${SYS[$i]}")
done

# --- report: bench report (baseline base, per-block wall vs dflash) + server tau beside the reference decoder's tau
RESULTS=(); for n in "${SYS[@]}"; do [ -s "$W/$n.jsonl" ] && RESULTS+=("$W/$n.jsonl"); done
if ((${#RESULTS[@]})); then
  cat "${RESULTS[@]}" > "$O/results.jsonl"
  BASE=(); [ -s "$W/base.jsonl" ] && BASE=(--baseline base)
  [ -s "$W/dflash.jsonl" ] && BASE+=(--block-ref dflash)
  PLOTS=(); "$PY" -c "import matplotlib" 2>/dev/null || PLOTS=(--no-plots)
  "$PY" -m sglang_lilicorr.benchmarks.cli bench report "${RESULTS[@]}" "${BASE[@]}" "${PLOTS[@]}" --out "$O" > "$W/report.txt" 2>&1 \
    || { tail -n 20 "$W/report.txt" | tee -a "$S"; fails+=(report); }
  grep -A12 "concurrency ${CONC[0]}" "$O/report.md" 2>/dev/null | head -n 14 | tee -a "$S"
  "$PY" - "$O/summary.json" "$REF/report/tables.json" "$O/tau_server_vs_reference.md" "${SYS[*]}" <<'EOF' 2>&1 | tee -a "$S" || fails+=(compare)
import json, sys
summary, tables, dst, order = sys.argv[1:]
cells = json.load(open(summary))["cells"]
ref = {(c["system"], c["set"]): c for c in json.load(open(tables))["cells"] if c["temperature"] == 0}
conc = sorted({c["concurrency"] for c in cells})
systems = [s for s in order.split() if any(c["system"] == s and c["tau"] is not None for c in cells)]  # speculative, SYSTEMS order
server = {(c["system"], c["group"], c["concurrency"]): c for c in cells if c["temperature"] == 0}
sets = sorted({g for (_, g, _) in server if g != "all"}) + ["all"]
fmt = lambda v: "--" if v is None else f"{v:.3f}"
head = ["set"] + [f"{s} {k}" for s in systems for k in ["server c=" + str(c) for c in conc] + ["reference"]] + [f"n (server c={conc[0]})"]
lines = ["T = 0, τ = completion tokens / verify blocks. Server: SGLang + `lilicorr bench` (this run); reference: "
         "PyTorch reference decoder, batch 1 (testbed/results/h200_2026-11-26, tables.json). Row `all` pools the "
         "server's prompts; the reference `all` is its per-set average.", "",
         "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
for g in sets:
    row = [g]
    for s in systems:
        row += [fmt((server.get((s, g, c)) or {}).get("tau")) for c in conc]
        row.append(fmt((ref.get((s.removesuffix("_eager"), "average" if g == "all" else g)) or {}).get("tau")))
    n = [(server.get((s, g, conc[0])) or {}).get("n_prompts") for s in systems]
    row.append("/".join(str(x) for x in n))
    lines.append("| " + " | ".join(row) + " |")
open(dst, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
else
  say "no bench results: nothing to report"; fails+=(report)
fi

# --- stage timings (STAGE_TIMING=1): the stage timer's JSON -> `bench stages` per c and kind (one
# process, so the CLI's imports are paid once); raw files kept
if [ "$STAGE_TIMING" = 1 ]; then
  GRAPH=(); EAGER=()
  for n in "${SYS[@]}"; do
    compgen -G "$W/stages/$n/*.json" > /dev/null || continue
    mkdir -p "$O/stages/raw/$n" && cp "$W/stages/$n"/*.json "$O/stages/raw/$n/"
    if [ "$n" = "${n%_eager}" ]; then GRAPH+=("$n=$W/stages/$n"); else EAGER+=("$n=$W/stages/$n"); fi
  done
  if ((${#GRAPH[@]} + ${#EAGER[@]} == 0)); then
    say "stages: STAGE_TIMING=1 but no speculative server wrote JSON under $W/stages"
  else
    timeout $((END - SECONDS > 10 ? END - SECONDS : 10)) "$PY" - "$O/stages" "${CONC[*]}" "${GRAPH[*]}" "${EAGER[*]}" <<'EOF' 2>&1 | tee -a "$S" \
      || { say "stages: some bench stages calls failed (raw timings in $O/stages/raw)"; fails+=(stages); }
import sys
from sglang_lilicorr.benchmarks.cli import main
out, concurrencies, graph, eager = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
failed = 0
for c in concurrencies:
    for suffix, timings, flags in (("", graph, []), ("_eager", eager, ["--eager"])):
        if timings:
            argv = ["bench", "stages", "--timings", *timings, "--bs", c, *flags, "--out", f"{out}/c{c}{suffix}"]
            print("stages: lilicorr " + " ".join(argv), flush=True)
            try:
                failed += main(argv) != 0
            except (Exception, SystemExit) as e:
                failed += 1
                print(f"stages: failed: {type(e).__name__}: {e}"[:400], flush=True)
sys.exit(1 if failed else 0)
EOF
  fi
fi
say "done; failed: ${fails[*]:-none}; files: $(ls "$O" | tr '\n' ' ')"
[ ${#fails[@]} = 0 ]
