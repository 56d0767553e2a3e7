"""The lab's train-8b step (benchmarks/training/train_8b.py) end to end at tiny shapes on the CPU, and its search for
the largest micro-batch that fits."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.training import train_8b


def test_the_search_stops_at_the_first_micro_batch_out_of_memory():
    def fits_below(limit):
        def try_step(size):
            if size >= limit:
                raise torch.cuda.OutOfMemoryError(f"{size} sequences")
            return float(size)

        return try_step

    assert train_8b.largest_micro_batch(fits_below(4), 64) == ({1: 1.0, 2: 2.0}, 4)
    assert train_8b.largest_micro_batch(fits_below(1), 64) == ({}, 1)
    assert train_8b.largest_micro_batch(fits_below(100), 8) == ({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, None)
    assert train_8b.largest_micro_batch(fits_below(100), 6) == ({1: 1.0, 2: 2.0, 4: 4.0}, None)


def test_the_timed_passes_fall_back_to_a_smaller_micro_batch_where_they_run_out_of_memory():
    from types import SimpleNamespace

    class Fake:
        optimizer = SimpleNamespace(zero_grad=lambda set_to_none: None)
        joint, device, cfg = SimpleNamespace(timer=None), torch.device("cpu"), SimpleNamespace(train="joint")

        def try_micro_batch(self, size):
            if size > 4:
                raise torch.cuda.OutOfMemoryError("search")
            return 10.0 * size

        def throughput(self, size, steps):
            if size == 4:
                raise torch.cuda.OutOfMemoryError("fragmented")
            return {"micro_batch": size}

        def phases(self, size, steps):
            return {"shares": {}}

    out = train_8b.measure(Fake(), limit=64, steps=1)
    assert (out["micro_batch"], out["peak_gib"], out["out_of_memory_at"]) == (2, 20.0, 8)
    assert out["peak_gib_by_micro_batch"] == {1: 10.0, 2: 20.0, 4: 40.0}


def test_the_step_runs_end_to_end_at_tiny_shapes(tmp_path, capsys):
    from sglang_lilicorr.train.state import draft_geometry

    argv = ["--tiny", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--steps", "1"]
    assert train_8b.main(argv) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["card"] == "cpu" and summary["data"]["tokens"] == 1e8 and summary["scaling_4gpu"] == 3.76
    assert draft_geometry(tmp_path / "work" / "draft").num_hidden_layers == 2  # the z-lab layout, read back
    for mode in ("head", "joint"):
        r = summary[mode]
        assert (r["micro_batch"], r["grad_accum"], r["out_of_memory_at"]) == (4, 1, None)
        assert r["peak_gib"] is None and r["mfu"] is None  # no GPU: no memory figure, no peak to compare with
        assert r["tok_s"] == pytest.approx(4 * 32 / r["step_s"])
        assert r["hours_per_epoch_1gpu"] == pytest.approx(1e8 / r["tok_s"] / 3600)
        assert r["recipe_hours_4gpu"] == pytest.approx(6 * r["hours_per_epoch_1gpu"] / 3.76)
        assert set(r["phases_ms_per_micro_step"]) == {"target", "drafter", "head", "backward"}
        assert sum(r["shares"].values()) == pytest.approx(1.0)
    assert summary["head"]["flops_per_token"]["drafter_backward"] == 0 < summary["joint"]["flops_per_token"]["total"]
    assert set(summary["joint_shares_by_part"]) == {"target", "drafter", "head", "optimizer"}
    assert sum(summary["joint_shares_by_part"].values()) == pytest.approx(1.0)
    assert "| tokens/s |" in capsys.readouterr().out
