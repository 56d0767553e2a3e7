#!/usr/bin/env bash
# The test command (README, .ci/run): install, lint and format check (ruff, pyproject.toml), then every CPU test. GPU tests (marked `gpu`)
# skip without CUDA; scripts/gpu_tests.sh runs them on the GPU machine. Two pytest-xdist workers (`-n 0`: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${LILICORR_VENV:-.venv}/bin/ruff" check --quiet . || { echo "ruff check failed (pyproject.toml): fix the lines above"; exit 1; }
"${LILICORR_VENV:-.venv}/bin/ruff" format --check --quiet . || { echo "ruff format --check failed: run \`.venv/bin/ruff format .\` and commit"; exit 1; }
exec "${LILICORR_VENV:-.venv}/bin/python" -m pytest -q -ra -n 2 tests "$@"
