#!/bin/bash
# Run a testbed step on the GPU machine after the device kit's `smol.sh install` and `smol.sh model`
# calls (same warm machine): /tmp/site holds the bundle + this project, /tmp/smol/model the bf16 target.
#   bash testbed/gpu.sh data && bash testbed/gpu.sh train all --minutes 6
# Exit 3: a fresh machine (rerun the two smol.sh calls first).
set -u -o pipefail
SITE=${DEVICE_SITE:-/tmp/site}
MODEL=${TESTBED_TARGET:-/tmp/smol/model}
if [ ! -f "$SITE/.device_manifest" ] || [ ! -f "$MODEL/config.json" ]; then
  echo "testbed/gpu.sh: no install in $SITE or no converted target in $MODEL: a fresh machine." >&2
  echo "testbed/gpu.sh: run 'bash .dev/bin/smol.sh install' and 'bash .dev/bin/smol.sh model' first (back to back)." >&2
  exit 3
fi
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1 \
       PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec python3 "$(dirname "$0")/run.py" --target "$MODEL" "$@"
