"""Entry point of SGLang's plugin system (setup.py: `sglang.srt.plugins`). SGLang calls `register()` in every process
(idempotent): the algorithm name, the default target attention hook and, where LILICORR_VERIFY_ATTENTION is set,
DFLASH's verify attention hook. The worker and its modules load when SGLang asks the factory for the worker."""

from __future__ import annotations

import os

from . import ALGORITHM_NAME
from . import verify_attention
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
    register_algorithm()
    register_target_attention_default()
    if os.environ.get(verify_attention.ENV):
        register_dflash_verify_attention()


# SGLang's resolution step (arg_groups/pipeline.py) that first fills an unset attention backend
TARGET_ATTENTION_STEP = "handle_deterministic_inference"


def default_target_attention(server_args, previous) -> None:
    """SGLang resolution hook: LILICORR's default target attention backend, then SGLang's own step."""
    from sglang.srt.arg_groups.overrides import record_foreign_defaults

    from .server_args import default_target_attention_backend

    record_foreign_defaults(server_args, "lilicorr.default_target_attention_backend", default_target_attention_backend)
    previous(server_args)


def register_target_attention_default() -> None:
    """Registers default_target_attention on SGLang's resolution pipeline. Idempotent."""
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    if TARGET_ATTENTION_STEP not in _registered:
        register_resolution_hook(TARGET_ATTENTION_STEP)(default_target_attention)
        _registered.add(TARGET_ATTENTION_STEP)


def register_dflash_verify_attention() -> None:
    """SGLang's DFLASH worker picks its verify attention by LILICORR_VERIFY_ATTENTION. Idempotent."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if verify_attention.DFLASH_INIT not in _registered:
        HookRegistry.register(verify_attention.DFLASH_INIT, verify_attention.after_dflash_init, HookType.AFTER)
        _registered.add(verify_attention.DFLASH_INIT)


_registered: set = set()  # the hook targets (and resolution steps) this process has registered


def register_algorithm() -> None:
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
