#!/usr/bin/env bash
# The GPU-marked tests (`-m gpu`) on a machine with a CUDA GPU, once SGLang and this project are installed there
# (`pip install -e .`; on this project's lent GPU machine the device kit's install: benchmarks/device/README.md).
# Runs from /tmp so that the installed package is the one imported, not the checkout's sglang_lilicorr/ folder.
# Extra arguments go to pytest, e.g. a test file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp
if [ "$#" -eq 0 ]; then set -- "$root/tests"; fi
exec "${PYTHON:-python3}" -m pytest -q -m gpu -p no:cacheprovider "$@"
