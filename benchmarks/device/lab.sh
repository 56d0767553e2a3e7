# Sourced by the device scripts that run the lab: ROOT (the checkout), and the checkout with the lab's plugin entry
# point (benchmarks/instrumentation/entry_point) at the end of PYTHONPATH, as benchmarks.lab_env does: then
# `python3 -m benchmarks STEP` runs from any folder against the installed package (the kit's $SITE, which install.sh
# puts first), and every SGLang server started here loads the lab's instrumentation plugin (a no-op unless
# LILICORR_STAGE_TIMING or LILICORR_PROPOSAL_RECORD is set).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
case ":${PYTHONPATH:-}:" in
  *":$ROOT:"*) ;;
  *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT:$ROOT/benchmarks/instrumentation/entry_point" ;;
esac
