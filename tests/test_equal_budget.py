"""The equal-budget comparison at 1x and 4x the one-GPU budget (docs/BASELINES.md) on the CPU: the summary's
`equal_budget_x4` key beside the 1x keys, the ranking of the four systems at both budgets, and the device calls'
plumbing of EQ_BUDGET (benchmarks/device/testbed_calls.sh eq-train with stand-ins for the testbed and nvidia-smi)."""

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from benchmarks.served import baselines_summary as bs
from sglang_lilicorr.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = bs.EQUAL_SYSTEMS


def inputs(folder: Path, steps: int, tau: dict, tps: dict, data: str = "abc") -> list[str]:
    """The three files baselines-summary reads: the replay's tau.json, the rounds' report summary, budget.json."""
    folder.mkdir(parents=True)
    cells = [
        {"set": name, "system": s, "temperature": t, "tau": tau[s] + (0.1 if name == "gsm8k" else 0.0) - 0.2 * t}
        for name in ("gsm8k", "average")
        for s in SYSTEMS
        for t in (0, 1)
    ] + [{"set": "average", "system": "lilicorr_viterbi", "temperature": 0, "tau": tau["lilicorr"] + 0.05}]
    rounds = [{"system": s, "group": "all", "temperature": 0, "concurrency": 1, "tps": tps[s]} for s in SYSTEMS]
    plan = {"step": steps, "init": "/tmp/init/dflash", "global_batch": 64, "data_sha256": data}
    budget = {s: {**plan, "train_config": {"max_steps": steps}} for s in SYSTEMS}
    for name, doc in (("tau.json", {"cells": cells}), ("rounds.json", {"cells": rounds}), ("budget.json", budget)):
        (folder / name).write_text(json.dumps(doc))
    return [
        "--replay",
        str(folder / "tau.json"),
        "--rounds",
        str(folder / "rounds.json"),
        "--budget",
        str(folder / "budget.json"),
    ]


TAU_X1 = {"dflash": 2.0, "lilicorr": 2.4, "domino": 2.2, "dspark": 2.1}
TPS_X1 = {"dflash": 300.0, "lilicorr": 340.0, "domino": 250.0, "dspark": 200.0}


def test_x4_keys_go_beside_the_x1_keys_and_the_rankings_are_compared(tmp_path):
    summary = tmp_path / "baselines" / "summary.json"
    summary.parent.mkdir()
    summary.write_text(json.dumps({"head_ms_8b": {"dflash": 0.0}, "viterbi": {"per_block_ms_8b": 7.5}}))
    assert bs.main([*inputs(tmp_path / "x1", 400, TAU_X1, TPS_X1), "--summary", str(summary)]) == 0
    one = json.loads(summary.read_text())
    assert one["plan"] == {"steps": 400, "global_batch": 64, "data": "abc"} and "equal_budget_x4" not in one
    assert not any(k.startswith("ranking_") for k in one)  # one budget: nothing to compare

    tau_x4 = {**TAU_X1, "dspark": 2.3}  # DSpark passes Domino at 4x on tau; tokens/s keeps its order
    x4 = inputs(tmp_path / "x4", 1600, tau_x4, {s: v * 1.1 for s, v in TPS_X1.items()})
    assert bs.main([*x4, "--summary", str(summary), "--budget-x", "4"]) == 0
    doc = json.loads(summary.read_text())
    assert doc["head_ms_8b"] == {"dflash": 0.0} and doc["viterbi"] == {"per_block_ms_8b": 7.5, "tau_t0": 2.45}
    assert doc["tau"] == one["tau"] and doc["tok_s"] == one["tok_s"] and doc["plan"]["steps"] == 400  # 1x kept
    group = doc["equal_budget_x4"]
    assert group["plan"]["steps"] == 1600 and group["viterbi"] == {"tau_t0": 2.45}
    assert group["tau"]["average"]["dspark"] == {"t0": 2.3, "t1": 2.1} and group["tok_s"]["1"]["lilicorr"] == 374.0
    cmp = doc["ranking_x1_x4"]
    assert cmp["steps"] == {"x1": 400, "x4": 1600} and cmp["same_data"] is True and cmp["same_order"] is False
    tau0 = cmp["measures"]["tau average T=0"]
    assert tau0 == {
        "x1": ["lilicorr", "domino", "dspark", "dflash"],
        "x4": ["lilicorr", "dspark", "domino", "dflash"],
        "same": False,
    }
    assert cmp["measures"]["tok/s c=1"]["same"] is True
    assert set(cmp["measures"]) == {"tau gsm8k T=0", "tau gsm8k T=1", "tau average T=0", "tau average T=1", "tok/s c=1"}

    md = summary.with_suffix(".md").read_text()
    assert "| tau average T=0 | x1 (400 steps) | 2 | 2.4 | 2.2 | 2.1 | lilicorr > domino > dspark > dflash |" in md
    assert "| tau average T=0 | x4 (1600 steps) |" in md
    assert "## Ranking at x1 and x4 (same data: True; same order on every measure: False)" in md
    assert "| tok/s c=1 | lilicorr > dflash > domino > dspark | lilicorr > dflash > domino > dspark | yes |" in md

    # the 1x keys merged again (after the 4x ones): the 4x group stays, the comparison is redone
    assert bs.main([*inputs(tmp_path / "x1b", 400, tau_x4, TPS_X1), "--summary", str(summary)]) == 0
    doc = json.loads(summary.read_text())
    assert doc["equal_budget_x4"] == group and doc["ranking_x1_x4"]["same_order"] is True


def test_a_budget_that_is_not_x_times_the_steps_or_other_data_is_named(tmp_path, capsys):
    summary = tmp_path / "summary.json"
    assert bs.main([*inputs(tmp_path / "x1", 400, TAU_X1, TPS_X1), "--summary", str(summary)]) == 0
    before = summary.read_text()
    x4 = inputs(tmp_path / "x4", 1000, TAU_X1, TPS_X1)
    assert bs.main([*x4, "--summary", str(summary), "--budget-x", "4"]) == 2
    assert "the drafts trained 1000 steps, the x1 drafts 400: not 4 times" in capsys.readouterr().err
    assert summary.read_text() == before  # nothing written
    assert bs.main([*x4, "--summary", str(summary), "--budget-x", "0"]) == 2
    other = inputs(tmp_path / "x4b", 1600, TAU_X1, TPS_X1, data="def")
    assert bs.main([*other, "--summary", str(summary), "--budget-x", "4"]) == 0
    assert json.loads(summary.read_text())["ranking_x1_x4"]["same_data"] is False
    budget = json.loads((tmp_path / "x4b" / "budget.json").read_text())
    budget["dspark"]["data_sha256"] = "abc"
    with pytest.raises(UsageError, match="the drafts' data_sha256 differ"):
        bs.check_budget(budget)


def calls_root(tmp_path: Path, gpus: int) -> tuple[Path, dict]:
    """A checkout holding testbed_calls.sh beside stand-ins: testbed.sh records its arguments (and the data it finds),
    nvidia-smi lists `gpus` GPUs; the shipped drafts' weights as carried."""
    root = tmp_path / "root"
    (root / "benchmarks" / "device").mkdir(parents=True)
    for name in ("testbed_calls.sh", "sglang_jit.sh"):
        shutil.copy(ROOT / "benchmarks" / "device" / name, root / "benchmarks" / "device")
    sweep = root / "benchmarks" / "results" / "testbed" / "h200x4_3f0f2a6"
    sweep.mkdir(parents=True)
    for name in ("depth.json", "batch.json"):
        (sweep / name).write_text("{}")
    (root / "benchmarks" / "device" / "testbed.sh").write_text(
        f'echo "$TESTBED_WORK $*" >> "{tmp_path}/testbed.txt"\n'
        f'[ "$1" = train ] && ls "$TESTBED_WORK/data" "$TESTBED_WORK/sweep" >> "{tmp_path}/testbed.txt"; exit 0\n'
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nfor i in $(seq {gpus}); do echo 'NVIDIA H200'; done\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    (root / ".dev" / "ckpt").mkdir(parents=True)
    for v in ("lilicorr", "dflash"):
        (root / "checkpoints" / f"smollm2-{v}").mkdir(parents=True)
        (root / "checkpoints" / f"smollm2-{v}" / "config.json").write_text("{}")
        (root / ".dev" / "ckpt" / f"{v}.safetensors").write_text(v)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        OUT=str(tmp_path / "ret"),
        CALLS_WORK=str(tmp_path / "calls"),
        CALLS_INIT=str(tmp_path / "init"),
        TESTBED_WORK=str(tmp_path / "testbed"),
        SGLANG_JIT_CACHE_DIR=str(tmp_path / "jit"),
        SGLANG_JIT_STATE=str(tmp_path / "jit.sum"),
    )
    return root, env


def call(root: Path, env: dict, name: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "benchmarks" / "device" / "testbed_calls.sh"), name],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_eq_train_trains_x_times_the_steps_on_the_carried_data(tmp_path):
    root, env = calls_root(tmp_path, gpus=4)
    data = tmp_path / "dataset"
    data.mkdir()
    for name in ("train.jsonl", "heldout.jsonl", "manifest.json"):
        (data / name).write_text(name)
    (root / ".dev" / "eq_data").mkdir(parents=True)
    with tarfile.open(root / ".dev" / "eq_data" / "dataset.tar.gz", "w:gz") as t:
        for f in data.iterdir():
            t.add(f, arcname=f.name)
    done = call(root, env, "eq-train", EQ_BUDGET="4", EQ_STEPS="10")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EQ_BUDGET=4: 40 optimizer steps each" in done.stdout
    seen = (tmp_path / "testbed.txt").read_text()
    work = str(tmp_path / "testbed")
    train = next(line for line in seen.splitlines() if line.startswith(f"{work} train "))
    assert train.startswith(f"{work} train dflash lilicorr domino dspark --steps 40 --global-batch 64 --init-draft ")
    assert "heldout.jsonl\nmanifest.json\ntrain.jsonl" in seen and "batch.json\ndepth.json" in seen
    assert (tmp_path / "init" / "dflash" / "model.safetensors").read_text() == "dflash"
    assert not (tmp_path / "init" / "lilicorr").exists()  # the one draft the four start from
    assert "--steps 10 " in call(root, env, "eq-train", EQ_STEPS="10").stdout + (tmp_path / "testbed.txt").read_text()

    root2, env2 = calls_root(tmp_path / "x2", gpus=2)
    done = call(root2, env2, "eq-train", EQ_BUDGET="4")
    assert done.returncode == 2 and "each of the four systems on its own GPU needs 4, this machine has 2" in done.stdout
    assert not (tmp_path / "x2" / "testbed.txt").exists()
    assert call(root, env, "eq-train", EQ_BUDGET="x").returncode == 2

    call(root, env, "eq-measure", WAIT_MINUTES="6")  # (its status: the last log's, empty here)
    assert f"{work} wait --minutes 6" in (tmp_path / "testbed.txt").read_text()


def test_the_data_call_returns_the_data_set(tmp_path):
    root, env = calls_root(tmp_path, gpus=4)
    (root / ".dev" / "bin").mkdir(parents=True)
    (root / ".dev" / "bin" / "smol.sh").write_text("exit 0\n")
    (root / "benchmarks" / "device" / "testbed.sh").write_text(  # the data step's files
        'mkdir -p "$TESTBED_WORK/data" && for f in train.jsonl heldout.jsonl manifest.json; do\n'
        '  echo "$f" > "$TESTBED_WORK/data/$f"; done\n'
    )
    done = call(root, env, "data")
    assert done.returncode == 0, done.stdout + done.stderr
    parts = sorted((tmp_path / "ret").glob("dataset.tar.gz.part_*"))
    assert parts and (tmp_path / "testbed" / "sweep" / "batch.json").is_file()
    (tmp_path / "joined.tar.gz").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(tmp_path / "joined.tar.gz") as t:
        assert sorted(t.getnames()) == ["heldout.jsonl", "manifest.json", "train.jsonl"]
