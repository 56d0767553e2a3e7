"""Opt-in record of the draft block each rank proposes for a request (`LILICORR_PROPOSAL_RECORD=DIR`), for comparing
proposals across tensor-parallel degrees and ranks (benchmarks/device/tp_check.sh, benchmarks/multi_gpu/tp_compare.py).

The instrumentation plugin (`plugin.register`) installs it on LILICORR's worker class when the variable is set. For
every request served alone in a decode batch, the block proposed in its first decode step is appended to
DIR/proposals_rank{R}.jsonl (R: the TP rank) as one line {"request": n, "rid": id, "batch": 1, "draft": [S token ids]},
n counting the requests this rank recorded. Recording syncs the forward stream at that step only; without the variable
nothing is wrapped.
"""

from __future__ import annotations

import json
import logging
import os

ENV_DIR = "LILICORR_PROPOSAL_RECORD"
logger = logging.getLogger(__name__)


def install(worker_cls: type, directory: str) -> None:
    """Wrap worker_cls.forward_batch_generation (once per class) so that it records into `directory`."""
    if getattr(worker_cls, "_proposal_record_dir", None):
        return
    os.makedirs(directory, exist_ok=True)
    forward = worker_cls.forward_batch_generation

    def forward_batch_generation(self, batch, *args, **kwargs):
        # judged before the forward: the worker turns a decode batch's mode into TARGET_VERIFY, an extend mode
        mode = batch.forward_mode
        alone = not (mode.is_extend() or mode.is_idle() or batch.is_extend_in_batch) and len(batch.reqs) == 1
        result = forward(self, batch, *args, **kwargs)
        if not alone:
            return result
        recorded = self.__dict__.setdefault("_recorded_rids", set())
        rid = batch.reqs[0].rid
        if rid not in recorded:
            record(self, rid, len(recorded), directory)
            recorded.add(rid)
        return result

    worker_cls.forward_batch_generation = forward_batch_generation
    worker_cls._proposal_record_dir = directory
    logger.info("LILICORR proposal record: the first block of each request served alone -> %s", directory)


def record(worker, rid, count: int, directory: str) -> None:
    """Append the block in the proposer's row 0 (the batch's one request) to this rank's file."""
    import torch
    from sglang.srt.runtime_context import get_parallel

    out = worker.proposer.out
    if out.is_cuda:
        torch.cuda.current_stream().synchronize()  # the draft graph wrote proposer.out on this stream
    line = {"request": count, "rid": str(rid), "batch": 1, "draft": out[: worker.proposer.slots].tolist()}
    with open(os.path.join(directory, f"proposals_rank{get_parallel().tp_rank}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
