#!/bin/bash
# tau THROUGH THE SGLANG SERVER on the testbed's held-out prompts: the shipped drafts served with
# --speculative-algorithm LILICORR (checkpoints/smollm2-lilicorr) and DFLASH (checkpoints/smollm2-dflash,
# the vanilla-trained drafter), plus the target without speculation (base) for speedup, measured by
# `lilicorr bench run` and reported by `lilicorr bench report` (baseline base), next to the reference
# decoder's tau of the same systems on the same prompts (testbed/results/h200_2026-11-26).
#
# Prompts: exactly those of the reference tables' T = 0 cells (the prompts every system finished in
# testbed/results/.../eval, 10 per set), at most PER_SET per set; T = 0, MAX_TOKENS new tokens,
# concurrency CONCURRENCY; chat API (the server applies the chat template, as the reference did).
#
# GPU machine, after gpu_check.sh's two calls (install; model) on the same warm machine:
#     bash testbed/serve_eval.sh          (one call, timeout_s 600; no carry needed)
# Phases run one server at a time in the order SYSTEMS; each is time-boxed (startup, then the bench
# until the phase's end), so one failing server leaves the others' results. The whole script stays
# within BUDGET seconds: a phase may use what the earlier ones left, minus RESERVE s kept for each
# later phase and 25 s for the report.
# Env: SYSTEMS ("lilicorr dflash base"), PER_SET (10), MAX_TOKENS (128), CONCURRENCY ("1 8"),
#   BUDGET (520), RESERVE (110), GRAPH_BS (16), PORT0 (30020: ports PORT0, PORT0 + 1, ...),
#   SMOL_WORK (/tmp/smol), DEVICE_SITE (/tmp/site),
#   PYTHON (python3), SERVE_EVAL_WORK (/tmp/serve_eval; its results are cleared first unless RESUME=1),
#   SERVE_EVAL_LAUNCH: a command that serves $PORT (env SYSTEM, PORT) instead of SGLang (CPU tests).
# Output in $OUT (<= 8 files): report.md + summary.json (bench report), its plots (<= 3 png, when
# matplotlib is there), tau_server_vs_reference.md, results.jsonl (every system's bench records),
# serve_eval.txt (this log; a failed server's traceback / last lines).
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

[ "${RESUME:-0}" = 1 ] || rm -f "$W"/*.jsonl  # RESUME=1: a rerun completes the missing prompts

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
  local name=$1 port=$2 log=$3 spec=()
  case $name in
    lilicorr) spec=(--speculative-algorithm LILICORR --speculative-draft-model-path "$ROOT/checkpoints/smollm2-lilicorr"
                    --speculative-draft-attention-backend triton) ;;
    dflash) spec=(--speculative-algorithm DFLASH --speculative-draft-model-path "$ROOT/checkpoints/smollm2-dflash"
                  --speculative-draft-attention-backend triton) ;;
    base) ;;
    *) say "unknown system $name (lilicorr, dflash or base)"; return 1 ;;
  esac
  if [ -n "${SERVE_EVAL_LAUNCH:-}" ]; then
    SYSTEM=$name PORT=$port setsid bash -c "$SERVE_EVAL_LAUNCH" > "$log" 2>&1 &
  else
    setsid "$PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$port" \
      --attention-backend triton --sampling-backend pytorch --grammar-backend none --mem-fraction-static 0.3 \
      --context-length 2048 --cuda-graph-backend-prefill disabled --max-running-requests 32 \
      --cuda-graph-max-bs-decode "${GRAPH_BS:-16}" "${spec[@]}" > "$log" 2>&1 &
  fi
  LIVE=$!
}

phase() {  # phase NAME PORT LATER: server up, bench until the phase's end, server down
  local name=$1 port=$2 later=$3 log=$W/$1.log up=0 t=$SECONDS rc=1
  local phase_end=$((END - 25 - later * ${RESERVE:-110}))
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
      --system "$name" --dataset "$PROMPTS" --results "$W/$name.jsonl" --concurrency "${CONC[@]}" --temperature 0 \
      --max-tokens "${MAX_TOKENS:-128}" --request-timeout 60 --no-progress 2>&1 | tail -n 5 | tee -a "$S"
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

# --- report: bench report (baseline base) + server tau beside the reference decoder's tau
RESULTS=(); for n in "${SYS[@]}"; do [ -s "$W/$n.jsonl" ] && RESULTS+=("$W/$n.jsonl"); done
if ((${#RESULTS[@]})); then
  cat "${RESULTS[@]}" > "$O/results.jsonl"
  BASE=(); [ -s "$W/base.jsonl" ] && BASE=(--baseline base)
  PLOTS=(); "$PY" -c "import matplotlib" 2>/dev/null || PLOTS=(--no-plots)
  "$PY" -m sglang_lilicorr.benchmarks.cli bench report "${RESULTS[@]}" "${BASE[@]}" "${PLOTS[@]}" --out "$O" > "$W/report.txt" 2>&1 \
    || { tail -n 20 "$W/report.txt" | tee -a "$S"; fails+=(report); }
  grep -A12 "concurrency ${CONC[0]}" "$O/report.md" 2>/dev/null | head -n 14 | tee -a "$S"
  "$PY" - "$O/summary.json" "$REF/report/tables.json" "$O/tau_server_vs_reference.md" <<'EOF' 2>&1 | tee -a "$S" || fails+=(compare)
import json, sys
summary, tables, dst = sys.argv[1:]
cells = json.load(open(summary))["cells"]
ref = {(c["system"], c["set"]): c for c in json.load(open(tables))["cells"] if c["temperature"] == 0}
conc = sorted({c["concurrency"] for c in cells})
systems = [s for s in ("lilicorr", "dflash") if any(c["system"] == s for c in cells)]
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
        row.append(fmt((ref.get((s, "average" if g == "all" else g)) or {}).get("tau")))
    n = [(server.get((s, g, conc[0])) or {}).get("n_prompts") for s in systems]
    row.append("/".join(str(x) for x in n))
    lines.append("| " + " | ".join(row) + " |")
open(dst, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
else
  say "no bench results: nothing to report"; fails+=(report)
fi
say "done; failed: ${fails[*]:-none}; files: $(ls "$O" | tr '\n' ' ')"
[ ${#fails[@]} = 0 ]
