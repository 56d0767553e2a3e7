#!/bin/bash
# SGLang's own JIT kernels on the lent GPU machine, carried from one machine to the next. The first server that runs
# one of them builds it with nvcc (sglang.kernels.jit: rmsnorm, rope, the KV store, the DFlash sampled verify, ...) into
# ~/.cache/sglang/jit, content-addressed, so a carried build is taken as is. On a fresh H200 the first four SmolLM2
# servers built 7 modules in 6 minutes and started in 71-146 s, with them carried in 9-17 s
# (benchmarks/results/backends/h200_171a5be_flashinfer_speed).
#   bash benchmarks/device/sglang_jit.sh unpack       at each call's start, before any server: the carried
#                                                .dev/sglang_jit/sglang_jit.tar.gz into the cache, once per machine
#   bash benchmarks/device/sglang_jit.sh pack DIR     where the machine's servers built modules since the unpack or the last
#                                                pack: the list (which, when), the whole cache as DIR/sglang_jit.tar.gz;
#                                                keep the last one returned as .dev/sglang_jit/sglang_jit.tar.gz
# Env: SGLANG_JIT_CACHE_DIR (~/.cache/sglang/jit), SGLANG_JIT_STATE (/tmp/sglang_jit.sum: the cache's builds when last
# unpacked or packed on this machine; STATE.carried once a carried cache was unpacked here). Exit 0 but for bad usage
# (2): a cache that cannot be unpacked or packed only costs the builds again, and says so.
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
JIT=${SGLANG_JIT_CACHE_DIR:-$HOME/.cache/sglang/jit}
STATE=${SGLANG_JIT_STATE:-/tmp/sglang_jit.sum}
CARRIED=$ROOT/.dev/sglang_jit/sglang_jit.tar.gz
log() { echo "[sglang_jit $(date +%H:%M:%S)] $*"; }
# the cache's builds (not those in progress)
modules() { { find "$JIT" -type f -name '*.so' -not -path '*/.staging-*' 2>/dev/null || true; } | sort; }
modules_sum() { modules | md5sum | cut -c1-32; }

case ${1:-} in
unpack)
  mkdir -p "$(dirname "$STATE")"
  if [ -f "$CARRIED" ] && [ ! -f "$STATE.carried" ]; then  # the first call on this machine that carries it
    if mkdir -p "$JIT" && tar -C "$JIT" -xzf "$CARRIED"; then
      log "SGLang's JIT cache carried: $(modules | wc -l) module build(s) unpacked into $JIT"
    else
      log "SGLang's JIT cache: unpacking $CARRIED failed; its kernels build again"
    fi
    touch "$STATE.carried" && modules_sum > "$STATE"
  fi
  [ -f "$STATE" ] || modules_sum > "$STATE"  # what the machine held before its first server
  exit 0
  ;;
pack)
  DIR=${2:?usage: bash benchmarks/device/sglang_jit.sh pack DIR}
  [ -n "$(modules)" ] && [ "$(modules_sum)" != "$(cat "$STATE" 2>/dev/null)" ] || exit 0
  find "$JIT" -name '*.so' -not -path '*/.staging-*' -printf '  SGLang JIT module %P (%TY-%Tm-%Td %TH:%TM)\n'
  if mkdir -p "$DIR" && tar -C "$JIT" --exclude='.staging-*' -czf "$DIR/sglang_jit.tar.gz" .; then
    mkdir -p "$(dirname "$STATE")" && modules_sum > "$STATE"
    log "SGLang's JIT cache grew on this machine ($(modules | wc -l) module build(s)): -> $DIR/sglang_jit.tar.gz;" \
      "carry it as .dev/sglang_jit/sglang_jit.tar.gz in the first call that starts a server"
  else
    log "SGLang's JIT cache: packing into $DIR failed; the next machine builds its kernels again"
  fi
  ;;
*)
  echo "usage: bash benchmarks/device/sglang_jit.sh unpack | pack DIR" >&2
  exit 2
  ;;
esac
