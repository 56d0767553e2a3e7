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

        def micro_step(self, size, accumulation):  # the kernels pass: nothing runs, no kernel is listed
            pass

        def sync(self):
            pass

    out = train_8b.measure(Fake(), limit=64, steps=1)
    assert (out["micro_batch"], out["peak_gib"], out["out_of_memory_at"]) == (2, 20.0, 8)
    assert out["largest_kernels"] == []
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
        kernels = r["largest_kernels"]  # CPU ops here (GPU kernels on a GPU), largest first
        assert kernels and [k["ms"] for k in kernels] == sorted((k["ms"] for k in kernels), reverse=True)
        assert 0 < sum(k["share"] for k in kernels) <= 1.0 + 1e-9
    assert summary["head"]["flops_per_token"]["drafter_backward"] == 0 < summary["joint"]["flops_per_token"]["total"]
    assert set(summary["joint_shares_by_part"]) == {"target", "drafter", "head", "optimizer"}
    assert sum(summary["joint_shares_by_part"].values()) == pytest.approx(1.0)
    assert "| tokens/s |" in capsys.readouterr().out


def _dp_rank(rank, world, port, argv):
    from test_train_ddp import join_gloo

    join_gloo(rank, world, port)
    assert train_8b.main(argv) == 0


def test_one_and_two_gloo_ranks_train_the_same_curve_and_the_summary_merges(tmp_path, capsys):
    """--dp-steps at tiny shapes: 1 rank (micro-batch 1 x accumulation 4) and 2 gloo ranks (1 x 2 x 2 ranks, DDP) train
    on the same micro-batches from the same seeded weights, so their loss curves agree within the SmolLM2 runs'
    tolerance; tp-compare train --key train_scaling_8b merges the ratio, the loss verdict and each rank's peak memory
    (null on a CPU) into a copy of the kept multi-gpu/summary.json, every other key of it kept."""
    import socket

    from ranks import start_ranks

    from benchmarks.multi_gpu import tp_compare

    for world in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = ["--tiny", "--dp-steps", "3", "--out", str(tmp_path / f"train_gpu{world}"), "--work", str(tmp_path)]
        start_ranks(_dp_rank, (world, port, argv), world)
    one, two = (tp_compare.jsonl(tmp_path / f"train_gpu{n}" / "metrics.jsonl") for n in (1, 2))
    assert [(r["step"], r["grad_accum"], r["world"]) for r in one] == [(1, 4, 1), (2, 4, 1), (3, 4, 1)]
    assert [(r["grad_accum"], r["peak_gib_per_gpu"]) for r in two] == [(2, [None, None])] * 3  # rank 0 writes alone
    assert one[0]["loss/total"] != one[2]["loss/total"]  # the curve moves: the comparison means something
    assert all(abs(a["loss/total"] - b["loss/total"]) < 1e-4 for a, b in zip(one, two))

    kept = tp_compare.Path(tp_compare.__file__).parents[1] / "results" / "multi-gpu" / "summary.json"
    summary = tmp_path / "summary.json"
    summary.write_text(kept.read_text())
    runs = [str(tmp_path / "train_gpu1"), str(tmp_path / "train_gpu2")]
    with pytest.raises(SystemExit) as e:
        tp_compare.main(["train", *runs, "--key", "train_scaling_8b", "--summary", str(summary), "--commit", "abc"])
    assert e.value.code == 0
    printed = capsys.readouterr().out
    assert "train_scaling_8b 2: " in printed and "(target >= 1.8x: " in printed and "LOSS_AGREE PASS" in printed
    before, after = json.loads(kept.read_text()), json.loads(summary.read_text())
    assert {k: v for k, v in after.items() if k not in ("train_scaling_8b", "train_scaling_8b_runs", "commit")} == {
        k: v for k, v in before.items() if k != "commit"
    }
    run = after["train_scaling_8b_runs"]["2"]
    ratio = run["tokens_per_s_median"] / run["tokens_per_s_median_1gpu"]
    assert list(after["train_scaling_8b"]) == ["2"] and after["train_scaling_8b"]["2"] == pytest.approx(ratio, abs=0.02)
    assert (run["commit"], run["steps"], run["loss_agrees"], run["loss_tolerance"]) == ("abc", 3, True, 0.0281)
    assert (run["peak_gib_per_gpu"], run["peak_gib_per_gpu_1gpu"]) == ([None, None], [None])
