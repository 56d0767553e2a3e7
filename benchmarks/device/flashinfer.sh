#!/usr/bin/env bash
# GPU side of flashinfer on the lent GPU machine. First run (H200): import, decode and prefill paged causal
# passed, the custom-mask verify failed (the quantization module, since in the archive). After the kit's install, in the
# same call (carry [".dev/whl", ".dev/pkgs", ".dev/bin", ".dev/manifest.txt", ".dev/flashinfer"], about 30 MiB):
#   source .dev/bin/install.sh && bash benchmarks/device/flashinfer.sh
# Steps (each fails loudly with one "flashinfer.sh: FAILED ..." line):
#   1. installs .dev/flashinfer/whl's wheels into $SITE (default /tmp/site) where the import fails (pynvml, tabulate)
#      or no ninja is on PATH; unpacks flashinfer_slim.tar.xz into $SITE/flashinfer (replacing a headers-only copy);
#   2. checks `import flashinfer` with the image's torch 2.11;
#   3. benchmarks/device/flashinfer_cache.sh unpack: .dev/flashinfer/jit_cache.tar.gz, if carried and built with this
#      machine's flashinfer and tvm_ffi, into flashinfer's cache ($FLASHINFER_WORKSPACE_BASE or $HOME)/.cache/flashinfer,
#      up to date for ninja (its header: why tvm_ffi's files are dated back); the modules it holds load, not build;
#   4. JIT-builds and runs benchmarks/device/flashinfer_warmup.py (decode, prefill paged causal, packbits, custom mask and
#      k/v strides apart, ragged auto/FA3 and FA2, merge_state, sampling, top-k at SmolLM2-135M's shapes; every
#      module of flashinfer_slim.py's MODULES but the spare page), timed;
#   5. flashinfer_cache.sh pack: the whole cache (objects and ninja logs too: ninja's files hold absolute paths, so the
#      next machine must use the same SITE and HOME) into $OUT/jit_cache.tar.gz (bring it back as
#      .dev/flashinfer/jit_cache.tar.gz), and writes
#      $OUT/flashinfer_warmup.txt.
# Env: SITE, MAX_JOBS (ninja's parallel jobs; default the CPU count), FI_SKIP_PACK=1 (no tarball), FI_BUILD_SECONDS
# (stop step 4 after that long and pack the partial cache; exit 4).
set -uo pipefail
fail() { echo "flashinfer.sh: FAILED: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/lab.sh"  # ROOT; `python3 -m benchmarks STEP` from any folder
root=$ROOT
kit=$root/.dev/flashinfer
SITE=${SITE:-${DEVICE_SITE:-/tmp/site}}
OUT=${OUT:-/tmp/flashinfer_out}
t_all=$SECONDS
[ -f "$kit/flashinfer_slim.tar.xz" ] || fail "$kit/flashinfer_slim.tar.xz missing: run bash benchmarks/device/flashinfer_kit.sh on the CPU machine and carry .dev/flashinfer"
[ -d "$SITE/sglang" ] || fail "$SITE has no sglang: start the command with 'source .dev/bin/install.sh &&'"
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
mkdir -p "$OUT"
log=$OUT/flashinfer_warmup.txt
: > "$log"

# 1) dependency wheels, only where missing (the image's own copies win), and the slim package
for w in "$kit"/whl/*.whl; do
  case "$(basename "$w")" in
    nvidia_ml_py-*) need=$(python3 -c "import pynvml" 2>/dev/null || echo y) ;;
    tabulate-*) need=$(python3 -c "import tabulate" 2>/dev/null || echo y) ;;
    ninja-*) need=$(command -v ninja >/dev/null || echo y) ;;
    *) need=y ;;
  esac
  if [ -n "$need" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade "$w" >>"$log" 2>&1 \
      || fail "pip install $(basename "$w") into $SITE failed (log $log)"
    echo "flashinfer.sh: installed $(basename "$w")" | tee -a "$log"
  fi
done
[ -x "$SITE/bin/ninja" ] && export PATH="$SITE/bin:$PATH"
command -v ninja >/dev/null || fail "no ninja on PATH (flashinfer's JIT runs it); .dev/flashinfer/whl should carry one"
command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || fail "no nvcc (set CUDA_HOME)"
t0=$SECONDS
rm -rf "$SITE/flashinfer" "$SITE"/flashinfer_python-*.dist-info
tar -C "$SITE" -xJf "$kit/flashinfer_slim.tar.xz" || fail "unpacking flashinfer_slim.tar.xz into $SITE failed"
echo "flashinfer.sh: slim flashinfer unpacked into $SITE in $((SECONDS - t0)) s" | tee -a "$log"

# 2) import
t0=$SECONDS
python3 -c "import torch, flashinfer, flashinfer.sampling, flashinfer.decode, flashinfer.prefill, flashinfer.cascade
assert flashinfer.__file__.startswith('$SITE/'), flashinfer.__file__
print(f'flashinfer.sh: import flashinfer {flashinfer.__version__} with torch {torch.__version__}, cuda {torch.version.cuda}')" \
  2>&1 | tee -a "$log" | tail -n 1 | grep -q "^flashinfer.sh: import" \
  || { tail -n 5 "$log" >&2; fail "import flashinfer failed (traceback above, log $log)"; }
tail -n 1 "$log"; echo "flashinfer.sh: import took $((SECONDS - t0)) s" | tee -a "$log"

# 3) carried JIT cache (flashinfer_cache.sh: tvm_ffi's headers dated back, the cache unpacked where its versions match)
cache=${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer
if [ -f "$kit/jit_cache.tar.gz" ]; then
  SITE=$SITE CACHE=$cache bash "$root/benchmarks/device/flashinfer_cache.sh" unpack "$kit/jit_cache.tar.gz" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "the carried JIT cache could not be used (line above)"
fi

# 4) build and run every module once
t0=$SECONDS
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
limit=${FI_BUILD_SECONDS:-0}  # > 0: stop the build after this many seconds and pack the cache built so far (exit 4)
(cd /tmp && if [ "$limit" -gt 0 ]; then timeout -k 10 "$limit" python3 -m benchmarks flashinfer-warmup
  else python3 -m benchmarks flashinfer-warmup; fi) 2>&1 | tee -a "$log" | grep "^flashinfer_warmup" \
  ; rc=${PIPESTATUS[0]}
partial=0
if [ "$limit" -gt 0 ] && { [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then
  partial=1 && echo "flashinfer.sh: build stopped after FI_BUILD_SECONDS=$limit s; the cache so far is packed: carry it back to go on" | tee -a "$log"
fi
[ "$rc" = 0 ] || [ "$partial" = 1 ] || { grep -v "^flashinfer_warmup" "$log" | tail -n 30 >&2; fail "warm-up failed (exit $rc; log $log)"; }
echo "flashinfer.sh: JIT build + warm-up took $((SECONDS - t0)) s (MAX_JOBS=$MAX_JOBS)" | tee -a "$log"

# 5) the cache, to carry back
if [ "${FI_SKIP_PACK:-0}" != 1 ]; then
  SITE=$SITE CACHE=$cache bash "$root/benchmarks/device/flashinfer_cache.sh" pack "$OUT/jit_cache.tar.gz" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "packing the JIT cache failed (line above)"
  echo "flashinfer.sh: bring $OUT/jit_cache.tar.gz back as .dev/flashinfer/jit_cache.tar.gz" | tee -a "$log"
fi
echo "flashinfer.sh: done in $((SECONDS - t_all)) s" | tee -a "$log"
[ "$partial" = 0 ] || exit 4
