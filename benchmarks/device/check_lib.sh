# The start of the GPU checks (gpu_check.sh, tp_check.sh), sourced once they set STEPS (comma-separated steps) and
# S (their summary file): step selection, the summary log, the fail list, EXTRA (EXTRA_ARGS split), the servers'
# backends (BACKEND_ARGS), the device kit's install of an earlier call, and an SGLang server started, awaited and stopped
# in its own process group.
T0=$SECONDS
fails=()
# The servers' backends: ATTN_BACKEND (the target's --attention-backend, default triton) and SAMPLING_BACKEND
# (--sampling-backend, default pytorch), BACKEND_ARGS in every server a check starts (the draft's attention stays
# triton: LILICORR serves no other). With neither flashinfer, flashinfer where present is benchmarks/device/flashinfer_headers.py's
# headers-only package: SGLang must not pick flashinfer kernels for its layers and sampling (is_flashinfer_available);
# its DFlash sampling verify finds the headers regardless. Naming flashinfer needs the package itself, installed by
# benchmarks/device/flashinfer.sh in an earlier call (start_server refuses otherwise).
ATTN_BACKEND=${ATTN_BACKEND:-triton}
SAMPLING_BACKEND=${SAMPLING_BACKEND:-pytorch}
BACKEND_ARGS=(--attention-backend "$ATTN_BACKEND" --sampling-backend "$SAMPLING_BACKEND")
if [[ " $ATTN_BACKEND $SAMPLING_BACKEND " == *" flashinfer "* ]]; then USES_FLASHINFER=1; unset SGLANG_IS_FLASHINFER_AVAILABLE
else USES_FLASHINFER=0; export SGLANG_IS_FLASHINFER_AVAILABLE=false; fi
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"
say() { echo "[t+$((SECONDS - T0))s] $*" | tee -a "$S"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }

use_install() {  # use_install SCRIPT: the kit's install in $SITE made by an earlier call on this machine, or exit 3
  if [ ! -f "$SITE/.device_manifest" ]; then
    echo "$1: $SITE holds no install: a fresh machine, not the one the install call set up. Run that call again, then the others at once." >&2
    exit 3
  fi
  case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
  export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
}

install_flashinfer_headers() {  # .dev/flashinfer_headers/flashinfer (benchmarks/device/flashinfer_headers.py), where carried, into $SITE
  if [ -d "$1/flashinfer_headers/flashinfer" ]; then
    rm -rf "$SITE/flashinfer" && cp -r "$1/flashinfer_headers/flashinfer" "$SITE/" \
      && say "flashinfer headers installed ($(wc -l < "$SITE/flashinfer/HEADERS_ONLY") files): SGLang verifies T > 0 by rejection sampling"
  fi
}

alive() {  # alive PGID: some process of the group is running (zombies, not yet reaped, do not count)
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {found = 1} END {exit !found}'
}

flashinfer_missing() {  # why the site folder's flashinfer cannot serve flashinfer backends (nothing when it can)
  local fi=${SITE:-/tmp/site}/flashinfer
  if [ ! -f "$fi/__init__.py" ]; then echo "no flashinfer package in ${SITE:-/tmp/site}"
  elif [ -f "$fi/HEADERS_ONLY" ]; then echo "${SITE:-/tmp/site}/flashinfer is the headers-only package"; fi
  return 0
}

start_server() {  # start_server NAME PORT LOG SERVER_ARGS...: sglang.launch_server in its own session (SERVER_PID), then
                  # /health awaited up to $TIMEOUT s (330); status 0 when the server is up
  local name=$1 port=$2 log=$3 t up=0 why=
  shift 3
  [ "$USES_FLASHINFER" = 1 ] && why=$(flashinfer_missing)
  if [ -n "${why:-}" ]; then
    say "$name: not started: ${BACKEND_ARGS[*]} needs flashinfer, and $why: run benchmarks/device/flashinfer.sh first (benchmarks/device/README.md)"
    SERVER_PID=; return 1
  fi
  setsid python3 -m sglang.launch_server --host 127.0.0.1 --port "$port" "$@" > "$log" 2>&1 &
  SERVER_PID=$!
  t=$SECONDS
  while (( SECONDS - t < ${TIMEOUT:-330} )); do
    kill -0 "$SERVER_PID" 2>/dev/null || { say "$name: server exited during startup"; break; }
    curl -sf -m 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1 && { up=1; break; }
    sleep 0.5
  done
  say "$name: startup $((SECONDS - t)) s, up=$up"
  [ $up = 1 ]
}

stop_server() {  # the process group of the last start_server: TERM, KILL after 20 s
  [ -n "${SERVER_PID:-}" ] || return 0
  kill -TERM -- -"$SERVER_PID" 2>/dev/null
  for _ in $(seq 80); do alive "$SERVER_PID" || break; sleep 0.25; done
  kill -KILL -- -"$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null
}
