#!/bin/bash
# Run a testbed step on the GPU machine after the device kit's install (`.dev/bin/smol.sh install`) and
# model (`.dev/bin/smol.sh model`) steps on the same warm machine: /tmp/site holds the bundle + this
# project, /tmp/smol/model the bf16 target. One call of the recipe in benchmarks/device/README.md:
#   bash benchmarks/device/testbed.sh data && bash benchmarks/device/testbed.sh sweep && bash benchmarks/device/testbed.sh train lilicorr dflash
# = `python -m benchmarks testbed --target /tmp/smol/model STEP ...` with the kit's site first on the path (python -P: the checkout's
# own sglang_lilicorr/ does not shadow the installed copy; the checkout's root only adds the lab, `benchmarks`).
# Exit 3: a fresh machine (its install or target is missing: run the kit's two steps first).
set -u -o pipefail
SITE=${DEVICE_SITE:-/tmp/site}
MODEL=/tmp/smol/model
if [ ! -f "$SITE/.device_manifest" ] || [ ! -f "$MODEL/config.json" ]; then
  echo "benchmarks/device/testbed.sh: no install in $SITE or no converted target in $MODEL: a fresh machine." >&2
  echo "benchmarks/device/testbed.sh: run 'bash .dev/bin/smol.sh install' and 'bash .dev/bin/smol.sh model' first (back to back)." >&2
  exit 3
fi
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
# the headers-only flashinfer (installed where the install call carried .dev/flashinfer_headers): SGLang verifies T > 0 with it
# but must not pick flashinfer kernels for its layers (as benchmarks/device/check_lib.sh)
[ -f "$SITE/flashinfer/HEADERS_ONLY" ] && export SGLANG_IS_FLASHINFER_AVAILABLE=false
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_MININTERVAL=30 \
       PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
source "$(dirname "$0")/lab.sh"  # the checkout after the kit's site: `benchmarks` only
# TESTBED_WORK (testbed_calls.sh sets it): the work folder, where the arguments name none (a --work of theirs comes later)
exec python3 -P -m benchmarks testbed --target "$MODEL" ${TESTBED_WORK:+--work "$TESTBED_WORK"} "$@"
