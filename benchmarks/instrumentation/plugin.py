"""The lab's SGLang plugin, `lilicorr_instrumentation` (group `sglang.srt.plugins`, declared in entry_point/).

SGLang calls `register()` in every process it starts. It installs the stage timer when LILICORR_STAGE_TIMING names a
folder (it wraps SGLang's DFlash and plain decode workers as they are built: benchmarks/README.md, "Stage
decomposition") and the proposal record when LILICORR_PROPOSAL_RECORD does (it wraps LILICORR's worker class:
benchmarks/device/tp_check.sh); with neither set it imports nothing and changes nothing. Both are idempotent.
"""

from __future__ import annotations

import os

from .proposal_record import ENV_DIR as PROPOSAL_RECORD
from .stage_timer import ENV_DIR as STAGE_TIMING


def register() -> None:
    if os.environ.get(STAGE_TIMING):
        from .stage_timer import install

        install(os.environ[STAGE_TIMING])
    if os.environ.get(PROPOSAL_RECORD):
        from sglang_lilicorr.serving.worker import LiLiCorrWorker
        from .proposal_record import install as install_record

        install_record(LiLiCorrWorker, os.environ[PROPOSAL_RECORD])
