#!/usr/bin/env bash
# The GPU-marked tests (`-m gpu`) on the GPU machine, after the SGLang bundle and this project are
# installed there (`source .dev/bin/install.sh`, or `bash tools/gpu_check.sh install`).
# Runs from /tmp so that the installed package is imported, not the checkout's plain sglang_lilicorr/
# folder (which lacks the kernels the install maps in). Extra arguments go to pytest, e.g. a test file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp
if [ "$#" -eq 0 ]; then set -- "$root/tests"; fi
exec "${PYTHON:-python3}" -m pytest -q -m gpu -p no:cacheprovider "$@"
