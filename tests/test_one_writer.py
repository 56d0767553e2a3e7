"""One writer per run folder, draft folder and results file; `--no-resume` never mixes two runs' steps; an export
replaces a draft whole. A second writer is refused with one line naming the holder's pid and host (exit 2); the
lock dies with its process, SIGKILL included. Every wait is bounded."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sglang_lilicorr import ownership
from sglang_lilicorr.cli import main
from stub_server import StubServer, bench_run_argv
from test_export_safety import rewrite_tensors, snapshot, write_run
from test_nothing_lost import error_line, metrics_rows, shaped, train_args
from test_train import make_target, write_conversations

HERE = f"pid {os.getpid()} on host {socket.gethostname()}"  # how a lock held by this process is named
WAIT_S = 120  # the longest any wait here lasts (a loaded 2-core machine starts a training process in ~10 s)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-writer")
    return {"target": make_target(root / "target"), "data": write_conversations(root / "data.jsonl", 8), "root": root}


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.05)


# --- the lock itself -------------------------------------------------------------------------------------------


HOLDER = """
import sys, time
from sglang_lilicorr.ownership import sole_writer
with sole_writer(sys.argv[1], "--x", "thing"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_writer_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path):
    target = tmp_path / "thing"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1])),
    )
    try:
        assert holder.stdout.readline() == "held\n"  # returns when the holder holds it (or dies: then it fails)
        with pytest.raises(ownership.HeldError) as refused:
            with ownership.sole_writer(target, "--x", "thing"):
                pass
        assert refused.value.what == f"{target} is being written by pid {holder.pid} on host {socket.gethostname()}"
        assert refused.value.where == "--x" and "one writer at a time" in refused.value.fix
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait(timeout=WAIT_S)
    assert ownership.lock_path(target).exists()  # the dead holder's file stays, unheld
    with ownership.sole_writer(target, "--x", "thing"):
        assert ownership.lock_path(target).read_text() == HERE + "\n"
    assert not ownership.lock_path(target).exists()  # released: its file goes
    assert ownership.held(tmp_path) == []  # a lock file is never what a folder holds


# --- train: two into one folder ----------------------------------------------------------------------------------


def test_a_second_train_into_a_running_run_is_refused_until_the_first_is_killed(ws, tmp_path, capsys):
    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "sglang_lilicorr.cli", *train_args(ws, run, "--max-steps", "100000")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[1])),
    )
    lock = ownership.lock_path(run)
    try:
        wait_for(lambda: lock.is_file() and lock.read_text().startswith(f"pid {first.pid} "), "the first run's lock")
        wait_for(lambda: (run / "latest").is_file(), "the first run's first checkpoint")
        for seed in ("0", "1"):  # a retried job, or another seed into the same folder
            code = main(train_args(ws, run, "--max-steps", "4", "--seed", seed))
            line = error_line(capsys)
            assert code == 2 and shaped(line), line
            assert f"{run} is being written by pid {first.pid} on host {socket.gethostname()}" in line
            assert "(--output-dir)" in line
        code = main(["export", str(run), str(run / "draft")])  # an export into the run: refused too
        assert code == 2 and "inside a training run" in error_line(capsys)
    finally:
        first.kill()
        first.wait(timeout=WAIT_S)
    assert main(train_args(ws, run, "--max-steps", "4")) == 0  # the killed run's lock died with it
    steps = [json.loads(r)["step"] for r in metrics_rows(run)]
    assert steps == list(range(1, len(steps) + 1))  # one run's steps, each once


def test_export_into_a_draft_being_written_and_bench_into_a_results_file_being_written_are_refused(tmp_path, capsys):
    run, draft, results = write_run(tmp_path / "run"), tmp_path / "draft", tmp_path / "results.jsonl"
    assert main(["export", str(run), str(draft)]) == 0
    before = snapshot(draft)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "hi"}\n')
    capsys.readouterr()
    with ownership.sole_writer(draft, "OUT_DIR", "draft"), ownership.sole_writer(results, "--results", "results"):
        assert main(["export", str(run), str(draft), "--dtype", "float32"]) == 2
        line = error_line(capsys)
        assert shaped(line) and f"{draft} is being written by {HERE} (OUT_DIR)" in line, line
        with StubServer() as server:
            assert main(bench_run_argv(prompts, results, "--no-progress", url=server.url)) == 2
            line = error_line(capsys)
            assert shaped(line) and f"{results} is being written by {HERE} (--results)" in line, line
            assert not server.log  # refused before a request
    assert snapshot(draft) == before and not results.exists()


# --- results files: each measurement once ------------------------------------------------------------------------


def test_a_measurement_recorded_twice_is_named_by_report_and_run(tmp_path, capsys):
    prompts, results = tmp_path / "p.jsonl", tmp_path / "results.jsonl"
    prompts.write_text('{"id": "a", "text": "hi"}\n{"id": "b", "text": "ho"}\n')
    with StubServer() as server:
        assert main(bench_run_argv(prompts, results, "--no-progress", url=server.url)) == 0
        lines = results.read_text().splitlines()
        results.write_text("\n".join([*lines, lines[0]]) + "\n")  # what two writers of one file made
        before = results.read_bytes()
        capsys.readouterr()
        for argv in (
            ["bench", "report", str(results), "--out", str(tmp_path / "rep")],
            bench_run_argv(prompts, results, "--no-progress", url=server.url),
        ):
            assert main(argv) == 1
            line = error_line(capsys)
            assert shaped(line) and f"({results}:3)" in line and "recorded twice, first at line 1" in line, line
    assert results.read_bytes() == before and not (tmp_path / "rep").exists()


# --- --no-resume ---------------------------------------------------------------------------------------------


def test_no_resume_refuses_a_folder_holding_a_run_and_move_aside_keeps_that_run_whole(ws, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(ws, run, "--max-steps", "8", "--save-every", "4")) == 0  # step-4, step-8
    before = snapshot(run)
    capsys.readouterr()
    code = main(train_args(ws, run, "--max-steps", "2", "--save-every", "1", "--no-resume"))
    line = error_line(capsys)
    assert code == 2 and shaped(line) and "(--no-resume)" in line and "--move-aside" in line, line
    assert f"{run} holds a run" in line and str(run.with_name("run.old-1")) in line
    assert snapshot(run) == before
    assert main(train_args(ws, run, "--max-steps", "2", "--move-aside")) == 2  # it goes with --no-resume
    assert "(--move-aside)" in error_line(capsys)
    assert main(train_args(ws, run, "--max-steps", "2", "--save-every", "1", "--no-resume", "--move-aside")) == 0
    assert f"moved the run in {run} to {run.with_name('run.old-1')}" in capsys.readouterr().err
    assert snapshot(run.with_name("run.old-1")) == before  # the old run, whole, beside the new one
    assert (run / "latest").read_text().strip() == "step-00000002"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    assert [json.loads(r)["step"] for r in metrics_rows(run)] == [1, 2]
    assert main(train_args(ws, run, "--max-steps", "3", "--save-every", "1")) == 0  # a plain resume: the new run's
    assert [json.loads(r)["step"] for r in metrics_rows(run)] == [1, 2, 3]
    assert main(["export", str(run), str(tmp_path / "draft")]) == 0


# --- an export replaces a draft as one unit ------------------------------------------------------------------------


def other_run(folder: Path) -> Path:
    """A run like write_run's with other weights (of the same dtype and geometry)."""
    write_run(folder)
    rewrite_tensors(folder, lambda t: t.__setitem__("fc.weight", t["fc.weight"] + 1))
    return folder


def test_an_export_over_an_earlier_one_swaps_the_folder(tmp_path):
    from sglang_lilicorr.drafter import load_draft

    old_run, new_run = write_run(tmp_path / "old"), other_run(tmp_path / "new")
    assert main(["export", str(old_run), str(tmp_path / "draft")]) == 0
    inode = (tmp_path / "draft").stat().st_ino
    assert main(["export", str(new_run), str(tmp_path / "draft")]) == 0
    assert (tmp_path / "draft").stat().st_ino != inode  # a new folder took the old one's place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "new", "old"]  # nothing left beside it
    drafter, _ = load_draft(tmp_path / "draft")
    assert torch.equal(drafter.state_dict()["fc.weight"], load_draft_weights_of(new_run)["fc.weight"])


def load_draft_weights_of(run: Path) -> dict:
    from sglang_lilicorr.checkpoint import load_tensors

    tensors = load_tensors(run / "checkpoints" / "step-00000002" / "trainable.safetensors", fix="")
    return {k: v.to(torch.bfloat16) for k, v in tensors.items()}


def test_config_and_weights_of_two_exports_are_refused(tmp_path, capsys):
    """Weights of one run beside the config of another, of equal dtype and geometry (an export replaces both as one
    folder, but a user may copy one file over): refused by name, and the next export mends it."""
    from sglang_lilicorr.checkpoint import CheckpointError
    from sglang_lilicorr.drafter import load_draft

    for name, run in (("a", write_run(tmp_path / "run-a")), ("b", other_run(tmp_path / "run-b"))):
        assert main(["export", str(run), str(tmp_path / name)]) == 0
    (tmp_path / "a" / "model.safetensors").write_bytes((tmp_path / "b" / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="config.json and model.safetensors are of two different exports"):
        load_draft(tmp_path / "a")
    assert main(["export", str(tmp_path / "run-b"), str(tmp_path / "a")]) == 0  # an export mends it
    load_draft(tmp_path / "a")


def test_where_names_cannot_be_exchanged_the_old_folder_is_renamed_aside(tmp_path, monkeypatch):
    monkeypatch.setattr(ownership, "exchange", lambda a, b: False)  # a file system without RENAME_EXCHANGE
    target = tmp_path / "d"
    target.mkdir()
    (target / "f").write_text("old")
    with ownership.atomic_directory(target) as new:
        (new / "f").write_text("new")
    assert (target / "f").read_text() == "new" and os.listdir(tmp_path) == ["d"]


def test_a_folder_named_as_a_file_the_block_writes_is_never_dropped(tmp_path):
    """atomic_directory(keep_all_but=...) replaces files of those names; a folder of such a name stays with the rest,
    so the block's write fails and nothing changes."""
    target = tmp_path / "d"
    (target / "w").mkdir(parents=True)
    (target / "w" / "shard").write_text("mine")
    with pytest.raises(OSError):
        with ownership.atomic_directory(target, keep_all_but=("w",)) as new:
            (new / "w").write_text("new")
    assert (target / "w" / "shard").read_text() == "mine" and os.listdir(tmp_path) == ["d"]
