#!/usr/bin/env bash
# The test command (README, .ci/run): install, then every CPU test. GPU tests (marked `gpu`)
# skip without CUDA; scripts/gpu_tests.sh runs them on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${LILICORR_VENV:-.venv}/bin/python" -m pytest -q -ra tests "$@"
