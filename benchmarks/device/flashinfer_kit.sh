#!/usr/bin/env bash
# CPU side of flashinfer on the lent GPU machine: makes .dev/flashinfer/ and touches nothing else.
#   bash benchmarks/device/flashinfer_kit.sh          (from the checkout's root; about 1-2 minutes the first time, 1 s after)
# Writes:
#   .dev/flashinfer/flashinfer_slim.tar.xz  flashinfer-python 0.7.2 slimmed to the JIT modules SGLang's flashinfer
#                                           attention backend and sampling use (benchmarks/device/flashinfer_slim.py)
#   .dev/flashinfer/whl/                    the dependency wheels the GPU image may lack and these paths import
#   .dev/flashinfer/KIT.txt                 sizes, the dependency list (shipped / downloaded / left out, and why)
# The GPU side is benchmarks/device/flashinfer.sh (carry .dev/flashinfer beside the kit's .dev/{whl,pkgs,bin,manifest.txt}).
# Env: FI_WHEEL (default /tmp/fi/flashinfer_python-0.7.2-py3-none-any.whl, else pip-downloaded into
# .dev/flashinfer/.cache/ and deleted after the build), PYTHON (a python with torch, for generating the JIT sources; default .venv/bin/python,
# then /work/main/.venv/bin/python). Idempotent: an unchanged wheel, helper and pins rebuild nothing.
set -euo pipefail
fail() { echo "flashinfer_kit: FAILED: $*" >&2; exit 1; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
[ -d .dev ] || fail ".dev/ is missing: run bash ../shared/device/prepare.sh first (it also git-ignores .dev/)"
kit=.dev/flashinfer
helper=benchmarks/device/flashinfer_slim.py
VERSION=0.7.2
# the deps flashinfer 0.7.2 declares that the GPU image may lack and that import flashinfer or the JIT build needs
DEPS=("nvidia-ml-py==13.615.71" "tabulate==0.10.0" "ninja==1.13.2")
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in "$root/.venv/bin/python" /work/main/.venv/bin/python python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch" 2>/dev/null; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || fail "no python with torch found: set PYTHON=/path/to/python (torch, CPU build is enough)"
mkdir -p "$kit/whl" "$kit/.cache"

wheel=${FI_WHEEL:-/tmp/fi/flashinfer_python-$VERSION-py3-none-any.whl}
if [ ! -f "$wheel" ] && [ -f "$kit/flashinfer_slim.tar.xz" ] && [ -f "$kit/.wheel_sha" ]; then
  wheel=""  # built before from a wheel no longer here: the stored sha256 stands in for it
elif [ ! -f "$wheel" ]; then
  wheel=$kit/.cache/flashinfer_python-$VERSION-py3-none-any.whl
  [ -f "$wheel" ] || "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux2014_x86_64 -d "$kit/.cache" "flashinfer-python==$VERSION" \
    || fail "pip download flashinfer-python==$VERSION failed (or set FI_WHEEL=path/to/the/wheel)"
fi

# 1) dependency wheels (Python 3.12, x86-64 Linux), exactly the pins
for d in "${DEPS[@]}"; do
  n=${d%%==*}; v=${d##*==}; f=$(ls "$kit/whl/" 2>/dev/null | grep -i "^${n//-/_}-${v}-" || true)
  [ -n "$f" ] && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d "$kit/whl" "$d" || fail "pip download $d failed"
done
for f in "$kit"/whl/*.whl; do  # drop wheels of earlier pins
  keep=0; for d in "${DEPS[@]}"; do n=${d%%==*}; v=${d##*==}; case "$(basename "$f")" in "${n//-/_}-${v}-"*) keep=1 ;; esac; done
  [ $keep = 1 ] || rm -f "$f"
done

# 2) the slim package (rebuilt only when the wheel, the helper or the pins change)
if [ -n "$wheel" ]; then wheel_sha=$(sha256sum "$wheel" | cut -d' ' -f1); else wheel_sha=$(cat "$kit/.wheel_sha"); fi
key=$( (echo "$wheel_sha"; sha256sum "$helper" | cut -d' ' -f1; printf '%s\n' "${DEPS[@]}") | sha256sum | cut -d' ' -f1)
tar=$kit/flashinfer_slim.tar.xz
if [ -f "$tar" ] && [ "$(cat "$kit/.key" 2>/dev/null)" = "$key" ]; then
  built="unchanged"
else
  rm -f "$kit/.key"
  [ -n "$wheel" ] || fail "the slim package is out of date and the wheel is gone: set FI_WHEEL or let it download"
  deps=$(mktemp -d "$kit/.cache/deps.XXXXXX")
  "$PY" -m pip install -q --no-deps --no-index --target "$deps" "$kit"/whl/*.whl >/dev/null \
    || fail "installing $kit/whl into a scratch folder failed"
  t0=$SECONDS
  report=$(FI_SLIM_DEPS=$deps "$PY" -m benchmarks flashinfer-slim build "$wheel" "$tar") || fail "$helper build failed (above)"
  echo "$report" > "$kit/.build.json"
  echo "$key" > "$kit/.key"
  built="built in $((SECONDS - t0)) s"
fi

echo "$wheel_sha" > "$kit/.wheel_sha"

# 3) KIT.txt and sizes
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
tar_b=$(stat -c %s "$tar"); whl_b=$(cat "$kit"/whl/*.whl | wc -c)
unpacked=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['unpacked'])" "$kit/.build.json")
files=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['files'])" "$kit/.build.json")
rm -rf "$kit/.cache"  # a downloaded wheel (65 MB) must not travel with carry [".dev/flashinfer"]
kit_b=$(find "$kit" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
{
  echo "flashinfer-python $VERSION for the GPU machine (benchmarks/device/flashinfer_kit.sh; GPU side benchmarks/device/flashinfer.sh)"
  echo "wheel: flashinfer_python-$VERSION-py3-none-any.whl, sha256 ${wheel_sha:0:16}... (65 MB; 453 MB, 10k files unpacked)"
  echo "flashinfer_slim.tar.xz: $(mib "$tar_b"), $files files, $(mib "$unpacked") unpacked"
  echo "whl/: $(mib "$whl_b"): $(cd "$kit/whl" && ls | tr '\n' ' ')"
  echo "carried (all of .dev/flashinfer): $(mib "$kit_b")"
  echo
  echo "flashinfer 0.7.2's declared dependencies:"
  echo "  shipped by the device kit (.dev/whl): apache-tvm-ffi 0.1.11 (flashinfer needs >=0.1.11,<0.2)"
  echo "  in the GPU image (torch 2.11's or SGLang's imports, which the kit serves without shipping them): torch,"
  echo "    numpy, packaging, requests, tqdm (all imported by 'import flashinfer'; also jinja2 and filelock, torch's)"
  echo "  downloaded here (.dev/whl of this kit, installed on the device only where the import fails):"
  echo "    nvidia-ml-py (pynvml: imported at 'import flashinfer', flashinfer/utils.py), ninja (the JIT build runs the"
  echo "    ninja binary; the GPU image builds SGLang's JIT kernels, so it likely has one), tabulate (flashinfer's"
  echo "    logging and CLI tables; small)"
  echo "  left out (nothing on the decode / prefill / ragged / packbits / sampling / cascade / page / top-k paths imports them;"
  echo "    'import flashinfer' succeeds without them, checked on the CPU by blocking each):"
  echo "    cuda-python (cuda.bindings: the CuTe-DSL, cuTile and NVRTC kernels; torch's own import loads it if present),"
  echo "    cuda-tile (cuTile kernels), nvidia-cutlass-dsl (CuTe-DSL kernels: MoE, MLA, GDN, SM100 FMHA; 95 MB),"
  echo "    nvidia-cudnn-frontend (cuDNN attention and GEMM backends), nccl4py and nccl-extensions (flashinfer.comm,"
  echo "    multi-GPU all-reduce fusion), einops (imported lazily by other ops), click (the flashinfer CLI only)"
} > "$kit/KIT.txt"
[ -d "$kit/flashinfer" ] && echo "flashinfer_kit: note: $kit/flashinfer (benchmarks/device/flashinfer_headers.py's headers-only package) is also there; benchmarks/device/flashinfer.sh replaces it in the site folder with the full package" >&2
echo "flashinfer_kit: slim package $built; $(sed -n 3,5p "$kit/KIT.txt" | tr '\n' ';')"
if [ "$kit_b" -gt $((50 * 1048576)) ]; then fail "$kit is $(mib "$kit_b"), over the 50 MiB a call can spare beside the kit"; fi
