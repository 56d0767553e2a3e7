#!/bin/bash
# The paper's cost table at Qwen3-8B scale on the lent GPU (benchmarks.served.scale): a random
# Qwen3-8B-shaped target (SGLang's dummy weights), random drafts built on the machine, no weights carried.
#
# CPU side, once, from the project root:   bash ../shared/device/prepare.sh      (no --smol)
# calls right after each other on one warm nvidia-h200, each carrying [".dev/whl", ".dev/pkgs", ".dev/bin",
# ".dev/manifest.txt"], timeout_s 600 (seconds: estimates from the H100 run of benchmarks/results/scale-qwen3-8b/,
# graph 406 s, base 183 s, eager 407 s with 3 servers on a fresh machine; the new ones not yet run on a GPU):
#     bash benchmarks/device/scale_gpu.sh graph          # ~430 s: LILICORR, DFLASH, the built-in; 8 paired rounds
#     bash benchmarks/device/scale_gpu.sh correctors     # ~450 s: Domino, DSpark, DFLASH (the phase's paired reference)
#     bash benchmarks/device/scale_gpu.sh base,eager     # ~510 s: no speculation; the five systems eager (one round per c)
#     GIT_COMMIT=C bash benchmarks/device/scale_gpu.sh heads  # ~120 s: corrector_bench (head ms per block; C: below)
#     bash benchmarks/device/scale_gpu.sh tput           # ~520 s, optional: LILICORR and the built-in, 1,024-token outputs
#     bash benchmarks/device/scale_gpu.sh widths7        # nvidia-h200 (six 8B servers), one call each, again where cut
#     bash benchmarks/device/scale_gpu.sh widths2        #   (it resumes): the adaptive verify width against each
#                                                        #   pinned width, blocks forced to commit 7 / 2 (not yet run)
# `heads` (in the list or alone) runs benchmarks.micro.corrector_bench into $OUT/corrector_bench.json
# before the phases. The copy of the checkout on the GPU machine has no .git, so name the commit on the call:
# write this checkout's `git rev-parse --short HEAD` into the command, `GIT_COMMIT=abc1234 bash benchmarks/device/scale_gpu.sh
# heads` (corrector_bench records it as meta.git_commit; unset, it records null and this script says so).
# Each call installs the kit (quick on a warm machine), builds the target config and the drafts (skipped
# when /tmp/scale holds them), then runs the phases; each phase packs $OUT/scale_<phase>.tar.gz when done. SGLang's
# JIT builds (benchmarks/device/sglang_jit.sh) come back as $OUT/sglang_jit.tar.gz where the servers built any: carry
# .dev/sglang_jit in the next session's first phase call (it fits beside the kit).
# The deadline is the call's start + SCALE_BUDGET_S (570 s): a phase it leaves no time for is skipped
# (exit 4: run it in the next call), and the rounds of a phase stop before one that would not finish. A
# phase measured whole by an earlier call on the same machine is only packed again; one cut short resumes.
# On the CPU machine: python -m benchmarks scale-report scale_*.tar.gz --out DIR \
#     --corrector-bench corrector_bench.json --baselines-summary benchmarks/results/baselines/summary.json
# Exit: 0 every phase measured; 1 a failure (the bundle holds the servers' logs); 4 a phase left for later.
set -u -o pipefail
DEADLINE=$(( $(date +%s) + ${SCALE_BUDGET_S:-570} ))
source "$(dirname "${BASH_SOURCE[0]}")/lab.sh"  # ROOT; `python3 -m benchmarks STEP` from any folder
W=${SCALE_WORK:-/tmp/scale}
O=${OUT:-/tmp/scale_out}
LIST=${1:?usage: bash benchmarks/device/scale_gpu.sh PHASES (graph, correctors, base, eager, tput, heads; comma-separated)}
PHASES=$(echo "$LIST" | tr ',' '\n' | grep -vx heads | paste -sd, -)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$O" "$W"
cd "$ROOT" || exit 1
# shellcheck disable=SC1091
source .dev/bin/install.sh > "$W/install.txt" 2>&1 || { tail -n 20 "$W/install.txt"; exit 1; }
tail -n 3 "$W/install.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cd /tmp || exit 1  # not the checkout: its plain sglang_lilicorr/ would shadow the installed package
if echo "$LIST" | tr ',' '\n' | grep -qx heads; then
  [ -n "${GIT_COMMIT:-}" ] || echo "corrector_bench: GIT_COMMIT is unset: meta.git_commit will be null (see this script's header)"
  python3 -m benchmarks corrector-bench --out "$O/corrector_bench.json" \
    ${GIT_COMMIT:+--commit "$GIT_COMMIT"} > "$O/corrector_bench.log" 2>&1
  echo "corrector_bench: exit $?"; tail -n 6 "$O/corrector_bench.log"
fi
[ -n "$PHASES" ] || exit 0
bash "$ROOT/benchmarks/device/sglang_jit.sh" unpack  # SGLang's JIT builds, where the call carries .dev/sglang_jit
python3 -m benchmarks scale build --work "$W" || exit 1
python3 -m benchmarks scale run --work "$W" --phases "$PHASES" --out "$O" --deadline "$DEADLINE"
rc=$?
bash "$ROOT/benchmarks/device/sglang_jit.sh" pack "$O"  # where the servers built more: $OUT/sglang_jit.tar.gz
exit "$rc"
