#!/bin/bash
# Run a testbed step on the GPU machine after the device kit's install (`.dev/bin/smol.sh install`) and
# model (`.dev/bin/smol.sh model`) steps on the same warm machine: /tmp/site holds the bundle + this
# project, /tmp/smol/model the bf16 target. One call of the recipe in docs/DEVELOPING.md:
#   bash testbed/gpu.sh data && bash testbed/gpu.sh sweep && bash testbed/gpu.sh train lilicorr dflash
# Exit 3: a fresh machine (its install or target is missing: run the kit's two steps first).
set -u -o pipefail
SITE=${DEVICE_SITE:-/tmp/site}
MODEL=${TESTBED_TARGET:-/tmp/smol/model}
if [ ! -f "$SITE/.device_manifest" ] || [ ! -f "$MODEL/config.json" ]; then
  echo "testbed/gpu.sh: no install in $SITE or no converted target in $MODEL: a fresh machine." >&2
  echo "testbed/gpu.sh: run 'bash .dev/bin/smol.sh install' and 'bash .dev/bin/smol.sh model' first (back to back)." >&2
  exit 3
fi
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_MININTERVAL=30 \
       PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec python3 "$(dirname "$0")/run.py" --target "$MODEL" "$@"
