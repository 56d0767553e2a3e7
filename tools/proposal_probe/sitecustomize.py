"""The proposal probe of tools/tp_check.sh: with PYTHONPATH=tools/proposal_probe and LILICORR_PROBE_DIR=DIR set for an
SGLang server, every process of that server records, once LILICORR's worker module is imported, the draft block each
rank proposes at each request's first decode step: one JSON line {"request": n, "draft": [S token ids]} per request
to DIR/proposals_rank{R}.jsonl (R: the TP rank). It reads the proposal's row 0, so requests must come one at a time
(gpu_client.py's sequential phase), and it syncs the forward stream at that step only. tp_compare.py compares the
files across ranks (every rank must draft the same block) and across TP degrees.

Python imports `sitecustomize` at start-up from sys.path, so the probe is in place in the scheduler processes SGLang
spawns; nothing of the package is changed. Without LILICORR_PROBE_DIR it does nothing.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys

WORKER = "sglang_lilicorr.serving.worker"


def record_first_blocks(worker_cls, directory: str) -> None:
    """Wrap worker_cls.forward_batch_generation: after a prefill, the next decode step's proposal (row 0) is written."""
    forward = worker_cls.forward_batch_generation

    def forward_batch_generation(self, batch, *args, **kwargs):
        result = forward(self, batch, *args, **kwargs)
        prefill = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        if prefill or batch.forward_mode.is_idle():
            self._probe_first_block_next = prefill or getattr(self, "_probe_first_block_next", False)
        elif getattr(self, "_probe_first_block_next", False):
            import torch
            from sglang.srt.runtime_context import get_parallel

            self._probe_first_block_next = False
            out = self.proposer.out
            if out.is_cuda:
                torch.cuda.current_stream().synchronize()  # the draft graph wrote proposer.out on this stream
            draft = out[: self.proposer.slots].tolist()
            count = getattr(self, "_probe_requests", 0)
            self._probe_requests = count + 1
            path = os.path.join(directory, f"proposals_rank{get_parallel().tp_rank}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps({"request": count, "batch": len(batch.req_pool_indices), "draft": draft}) + "\n")
        return result

    worker_cls.forward_batch_generation = forward_batch_generation


class _AfterWorkerImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when the worker module is looked up, it lets the other finders find it and wraps the
    loader so that the probe is installed right after the module runs."""

    def find_spec(self, name, path=None, target=None):
        if name != WORKER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            record_first_blocks(module.LiLiCorrWorker, os.environ["LILICORR_PROBE_DIR"])

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("LILICORR_PROBE_DIR"):
    os.makedirs(os.environ["LILICORR_PROBE_DIR"], exist_ok=True)
    sys.meta_path.insert(0, _AfterWorkerImport())
