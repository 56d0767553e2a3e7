#!/usr/bin/env bash
# Mutation testing of the modules that decide correctness with mutmut (docs/MUTATION.md):
#   scripts/mutation.sh [MODULE ...] [--max-children N] [--only MUTANT ...]
# Not part of scripts/test.sh nor of CI. One module runs in minutes on 2 cores; nice keeps the machine usable.
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice "${LILICORR_VENV:-.venv}/bin/python" scripts/mutmut_modules.py "$@"
