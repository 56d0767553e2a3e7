"""Entry point of SGLang's plugin system (setup.py: group `sglang.srt.plugins`,
`lilicorr = sglang_lilicorr.serving.plugin:register`).

SGLang calls `register()` in every process it starts (launcher, tokenizer manager, scheduler,
detokenizer), and tests may call it again: registration is idempotent. It registers the name only;
the worker, draft model and kernels load in the scheduler process when SGLang asks the factory for
the worker class.
"""
from __future__ import annotations

from . import ALGORITHM_NAME
from .algorithm import LiLiCorrSpecAlgo


def worker_factory(server_args) -> type:
    """SGLang's WorkerFactory: the worker class for one scheduler process."""
    from .kv_rows import widen_rows
    from .models import register_draft_model
    from .worker import LiLiCorrWorker

    register_draft_model()
    widen_rows()  # before the scheduler builds the pools (kv_rows.py says why)
    return LiLiCorrWorker


def validate(server_args) -> None:
    from .server_args import validate_server_args

    validate_server_args(server_args)


def register() -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        existing = SpeculativeAlgorithm.from_string(ALGORITHM_NAME)
    except ValueError:  # not registered yet in this process
        existing = None
    if existing is not None:
        if not isinstance(existing, LiLiCorrSpecAlgo):
            raise RuntimeError(
                f"--speculative-algorithm {ALGORITHM_NAME} is already registered by {existing!r}, not by "
                "sglang-lilicorr: two plugins claim the name; restrict them with SGLANG_PLUGINS=lilicorr."
            )
        return
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=True,  # the DFlash v2 worker runs under the overlap scheduler
        validate_server_args=validate,
        spec_class=LiLiCorrSpecAlgo,
    )(worker_factory)
