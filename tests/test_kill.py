"""A kill at a random write point of train, export and regenerate (tests/kill_harness.py: SIGKILL, or SIGINT, just
before the N-th replace / fsync / removal / file opened to write) leaves the old or the new state; after SIGINT no
temporary is left, after SIGKILL the next run of the command removes them and completes. The point is
drawn from LILICORR_TEST_SEED; each case is one killed child process (forked from the test's) and at most one rerun."""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import forked
import kill_harness
from conftest import SEED
from sglang_lilicorr import ownership
from sglang_lilicorr.cli import main
from test_export_safety import DRAFT, snapshot, tree, users_folder
from test_nothing_lost import train_args
from test_train import make_target, recipe_argv, write_conversations

HERE = Path(__file__)
HARNESS = HERE.parent / "kill_harness.py"
# write points of each command as measured (tests/kill_harness.py prints them): the kill lands within them
POINTS = {"train": 17, "export": 7, "export-force": 21, "export-new": 6, "regenerate": 4, "recipe": 16}


def lilicorr(at: int | str, sig: str, *args) -> subprocess.CompletedProcess:
    """kill_harness.run in a child forked from this process (tests/forked.py: a case costs its command, not an
    interpreter's start-up): its exit status (-N: killed by signal N) and what it wrote to stderr."""
    with tempfile.TemporaryFile() as err, open(os.devnull, "w") as out:
        argv = list(map(str, args))
        child = forked.start(
            lambda: kill_harness.run(str(at), getattr(signal, sig), argv), stdout=out.fileno(), stderr=err.fileno()
        )
        try:
            child.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            raise
        err.seek(0)
        return subprocess.CompletedProcess(argv, child.returncode, "", err.read().decode(errors="replace"))


def harness_subprocess(at: str, sig: str, *args) -> subprocess.CompletedProcess:
    """tests/kill_harness.py as a program of its own: for what happens as the interpreter exits."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(map(str, (HERE.parent, HERE.parents[1]))))
    return subprocess.run(
        [sys.executable, str(HARNESS), at, sig, "--", *map(str, args)], capture_output=True, text=True, env=env
    )


def point(command: str, sig: str) -> int:
    return random.Random(f"{SEED}:{command}:{sig}").randint(1, POINTS[command])


def temporaries(root: Path) -> list:
    return [p for p in root.rglob("*") if ownership.is_temporary(p)]


def killed(result, sig: str) -> bool:
    if "Traceback" in result.stderr:
        return False
    if sig == "SIGINT":  # one line, by the rule
        return result.returncode == 130 and "error: interrupted (SIGINT): " in result.stderr
    return result.returncode == {"SIGKILL": -9, "SIGTERM": -15}[sig]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": f"count {i}"}) + "\n" for i in range(3)))
    return {
        "root": root,
        "target": make_target(root / "target"),
        "data": write_conversations(root / "data.jsonl", 8),
        "prompts": prompts,
    }


def run_state(run: Path) -> tuple:
    """(the steps of every checkpoint, which all load, the step `latest` names, the logged steps)."""
    from sglang_lilicorr.train.state import complete_checkpoints, read_optimizer_state, read_training_checkpoint

    steps = []
    for path in complete_checkpoints(run):
        state, *_ = read_training_checkpoint(path)
        read_optimizer_state(path)
        steps.append(state["step"])
    latest = (run / "latest").read_text().strip()
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sorted(steps), latest, logged


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_killed_resume_leaves_the_old_or_the_new_run(ws, tmp_path, sig):
    run = tmp_path / "run"
    assert main(train_args(ws, run, "--max-steps", "2")) == 0
    old = run_state(run)
    result = lilicorr(point("train", sig), sig, *train_args(ws, run, "--max-steps", "4"))
    steps, latest, logged = run_state(run)
    assert killed(result, sig), result.stderr[-2000:]
    assert set(old[0]) <= set(steps) <= {2, 4} and latest in ("step-00000002", "step-00000004")
    assert logged[: len(old[2])] == old[2] and logged == list(
        range(1, len(logged) + 1)
    )  # each step once, the old rows kept
    if sig == "SIGINT":
        assert not temporaries(tmp_path)
    # the rerun resumes, cleans up, completes
    assert lilicorr(10**6, sig, *train_args(ws, run, "--max-steps", "4")).returncode == 0
    assert run_state(run)[1:] == ("step-00000004", [1, 2, 3, 4]) and not temporaries(tmp_path)


@pytest.fixture(scope="module")
def drafts(ws):
    """Two runs (one and two steps) and the draft each exports: an old draft in place, the new one expected."""
    root = ws["root"] / "drafts"
    old_run, new_run, old, new = root / "old", root / "new", root / "old-draft", root / "new-draft"
    assert (
        main(train_args(ws, old_run, "--max-steps", "1")) == 0
        and main(train_args(ws, new_run, "--max-steps", "2")) == 0
    )
    assert main(["export", str(old_run), str(old)]) == 0 and main(["export", str(new_run), str(new)]) == 0
    return {"new_run": new_run, "old": snapshot(old), "new": snapshot(new)}


def a_draft(folder: Path, files: dict) -> Path:
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT", "SIGTERM"])
@pytest.mark.parametrize("at", ["random", "exchange"])
def test_a_killed_export_leaves_the_old_or_the_new_draft(drafts, tmp_path, sig, at):
    """Killed at a random write point, or at the one where the new draft takes the old one's place."""
    from sglang_lilicorr.drafter import load_draft

    draft = a_draft(tmp_path / "draft", drafts["old"])
    result = lilicorr(point("export", sig) if at == "random" else at, sig, "export", drafts["new_run"], draft)
    assert killed(result, sig), result.stderr[-2000:]
    now = snapshot(draft)
    assert now in (drafts["old"], drafts["new"])  # whole: the old draft or the new one, nothing else in it
    if at == "exchange":
        assert now == drafts["old"]  # killed before the swap
    load_draft(draft)  # whichever it is, it loads (its checksum checked)
    if sig == "SIGINT":
        assert not temporaries(tmp_path)
    assert main(["export", str(drafts["new_run"]), str(draft)]) == 0  # the next export mends what a kill left
    assert snapshot(draft) == drafts["new"] and not temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]  # no lock file or temporary beside it


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT", "SIGTERM"])
@pytest.mark.parametrize("at", ["random", "exchange", "put_back"])
def test_a_killed_force_export_leaves_the_old_or_the_new_draft_and_all_else(drafts, tmp_path, sig, at):
    """--force over a folder of the user's that holds a draft: killed at a random write point, just before the swap
    or just after it, the folder holds the old draft or the new one, and every other entry as it was (bytes, mode)."""
    from sglang_lilicorr.drafter import load_draft

    draft = users_folder(a_draft(tmp_path / "draft", drafts["old"]))
    before = tree(draft)
    args = ["export", drafts["new_run"], draft, "--force"]
    result = lilicorr(point("export-force", sig) if at == "random" else at, sig, *args)
    assert killed(result, sig), result.stderr[-2000:]
    now = {k: v for k, v in snapshot(draft).items() if k in DRAFT}
    assert now in (drafts["old"], drafts["new"])  # whole: the old draft or the new one
    if at != "random":
        assert now == drafts["old" if at == "exchange" else "new"]  # killed just before the swap, or just after it
    assert tree(draft) == before  # the user's files, folders and symlinks as they were
    load_draft(draft)
    if sig == "SIGINT":
        assert not temporaries(tmp_path)
    assert main(["export", str(drafts["new_run"]), str(draft), "--force"]) == 0  # the next one mends what a kill left
    assert snapshot(draft)["model.safetensors"] == drafts["new"]["model.safetensors"] and tree(draft) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]  # no lock file or temporary beside it


def test_an_interrupt_once_an_export_is_done_prints_nothing(drafts, tmp_path):
    """SIGINT after the command returned, before the interpreter's exit hooks run: no traceback, the export's code."""
    draft = a_draft(tmp_path / "draft", drafts["old"])
    result = harness_subprocess("end", "SIGINT", "export", drafts["new_run"], draft)
    assert result.returncode == 0 and "Traceback" not in result.stderr and "error" not in result.stderr, result.stderr
    assert snapshot(draft) == drafts["new"]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_killed_regenerate_keeps_every_row_it_had(ws, tmp_path, sig):
    out = tmp_path / "out.jsonl"
    args = [
        "regenerate",
        "--target",
        ws["target"],
        "--prompts",
        ws["prompts"],
        "--output",
        out,
        "--engine",
        "transformers",
        "--max-new-tokens",
        "3",
    ]
    first = json.dumps({"id": "p0", "messages": [], "turns": []}) + "\n"
    out.write_text(first)
    result = lilicorr(point("regenerate", sig), sig, *args)
    assert killed(result, sig), result.stderr[-2000:]
    assert out.read_text().startswith(first) and all(json.loads(line)["id"] for line in out.read_text().splitlines())
    if sig == "SIGINT":
        assert not temporaries(tmp_path)
    assert lilicorr(10**6, sig, *args).returncode == 0
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == ["p0", "p1", "p2"] and not temporaries(tmp_path)


def test_a_killed_recipe_leaves_whole_files_and_resumes(ws, tmp_path):
    exclude = tmp_path / "eval.jsonl"
    exclude.write_text('{"id": "e", "text": "what is two plus two"}\n')
    data = tmp_path / "data"
    args = recipe_argv(ws["target"], data, exclude, 3, package=2, heldout=1, max_new_tokens=3)
    result = lilicorr(point("recipe", "SIGKILL"), "SIGKILL", *args)
    assert killed(result, "SIGKILL"), result.stderr[-2000:]
    for name in ("train.jsonl", "heldout.jsonl", "manifest.json", "conversations.jsonl"):  # absent or whole
        if (data / name).exists():
            text = (data / name).read_text()
            json.loads(text) if name.endswith(".json") else [json.loads(line) for line in text.splitlines()]
    assert lilicorr(10**6, "SIGKILL", *args).returncode == 0
    manifest = json.loads((data / "manifest.json").read_text())
    rows = (data / "conversations.jsonl").read_text().splitlines()
    assert manifest["counts"]["conversations"] == len(rows) == len({json.loads(r)["id"] for r in rows})
    assert not temporaries(tmp_path)


def test_a_killed_export_into_a_new_folder_leaves_none_or_a_whole_draft(ws, tmp_path):
    from sglang_lilicorr.drafter import load_draft

    run, draft = tmp_path / "run", tmp_path / "drafts" / "new"
    assert main(train_args(ws, run, "--max-steps", "1")) == 0
    result = lilicorr(point("export-new", "SIGKILL"), "SIGKILL", "export", run, draft)
    assert killed(result, "SIGKILL"), result.stderr[-2000:]
    if draft.exists():
        load_draft(draft)  # appeared whole
    assert lilicorr(10**6, "SIGKILL", "export", run, draft).returncode == 0
    assert sorted(snapshot(draft)) == ["config.json", "model.safetensors"] and not temporaries(tmp_path)
