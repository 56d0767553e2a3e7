#!/usr/bin/env bash
# Mutation testing of the modules that decide correctness (docs/MUTATION.md): scripts/mutation.sh [MODULE ...] [--summary FILE]
# Not part of scripts/test.sh. One module runs in minutes on 2 cores; nice keeps the machine usable.
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice "${LILICORR_VENV:-.venv}/bin/python" scripts/mutation.py "$@"
