#!/usr/bin/env bash
# flashinfer's JIT cache carried between GPU machines (run by benchmarks/device/flashinfer.sh):
#   bash benchmarks/device/flashinfer_cache.sh unpack TARBALL   a carried cache into CACHE, up to date on this machine
#   bash benchmarks/device/flashinfer_cache.sh pack TARBALL     CACHE, with the versions it was built with, into TARBALL
# flashinfer loads a JIT module after ninja finds it up to date, and ninja rebuilds an object whose inputs are newer
# than it. Every module includes tvm_ffi's headers, which the device kit's pip install dates at this machine's install
# time, later than any carried object: `unpack` dates tvm_ffi's files in SITE back to 1970 (as the slim flashinfer's
# already are), then unpacks the cache only where its KIT.txt names this machine's flashinfer and tvm_ffi versions,
# and says how many modules ninja finds up to date (those load without a build) and which it will build.
# Env: SITE (/tmp/site), CACHE ($FLASHINFER_WORKSPACE_BASE or $HOME, then /.cache/flashinfer).
set -uo pipefail
fail() { echo "flashinfer_cache.sh: FAILED: $*" >&2; exit 1; }
MODE=${1:-} TARBALL=${2:-}
case $MODE in unpack|pack) [ -n "$TARBALL" ] || fail "usage: bash benchmarks/device/flashinfer_cache.sh unpack|pack TARBALL" ;;
  *) fail "usage: bash benchmarks/device/flashinfer_cache.sh unpack|pack TARBALL" ;; esac
SITE=${SITE:-/tmp/site}
CACHE=${CACHE:-${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer}
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
versions=$(python3 -c "from importlib.metadata import version as v
print(f\"flashinfer {v('flashinfer-python')}, apache-tvm-ffi {v('apache-tvm-ffi')}\")" 2>/dev/null) \
  || fail "no flashinfer-python or apache-tvm-ffi installed in $SITE: install the device kit and flashinfer first"

if [ "$MODE" = pack ]; then
  [ -d "$CACHE" ] || fail "no JIT cache at $CACHE to pack"
  echo "$versions" > "$CACHE/KIT.txt" && tar -C "$CACHE" -czf "$TARBALL" . || fail "packing $CACHE into $TARBALL failed"
  echo "flashinfer_cache.sh: $TARBALL $(du -h "$TARBALL" | cut -f1) (cache $(du -sh "$CACHE" | cut -f1), $versions)"
  exit 0
fi

[ -f "$TARBALL" ] || fail "no carried JIT cache at $TARBALL"
command -v ninja >/dev/null || fail "no ninja on PATH (flashinfer's JIT runs it; .dev/flashinfer/whl carries one)"
tvm_dir=$(python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('tvm_ffi').origin))") \
  || fail "tvm_ffi is not importable from $SITE"
case $tvm_dir in "$SITE"/*) find "$tvm_dir" -exec touch -h -d @0 {} + ;; esac
carried=$(tar -xzOf "$TARBALL" ./KIT.txt 2>/dev/null)
if [ "$carried" != "$versions" ]; then
  echo "flashinfer_cache.sh: carried JIT cache left out: built with '${carried:-no KIT.txt}', this machine has" \
    "'$versions'; every module builds"
  exit 0
fi
mkdir -p "$CACHE" && tar -C "$CACHE" -xzf "$TARBALL" || fail "unpacking $TARBALL into $CACHE failed"
fresh=0 stale=()
for d in "$CACHE"/*/*/cached_ops/*/; do
  [ -f "$d/build.ninja" ] || continue
  if ninja -C "$d" -n 2>/dev/null | grep -q "no work to do"; then fresh=$((fresh + 1)); else stale+=("$(basename "$d")"); fi
done
echo "flashinfer_cache.sh: carried JIT cache unpacked into $CACHE ($(du -sh "$CACHE" | cut -f1)): $fresh module(s)" \
  "up to date, ${#stale[@]} to build or finish (${stale[*]:-none})"
