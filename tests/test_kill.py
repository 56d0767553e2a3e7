"""A kill at a random write point of train, export and regenerate (tests/kill_harness.py: SIGKILL, or SIGINT, just
before the N-th replace / fsync / removal / file opened to write) leaves the old or the new state; after SIGINT no
temporary is left, after SIGKILL the next run of the command removes them and completes (issue 40). The point is
drawn from LILICORR_TEST_SEED; each case is one killed subprocess and at most one rerun."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SEED
from sglang_lilicorr import ownership
from sglang_lilicorr.cli import main
from test_export_safety import snapshot
from test_nothing_lost import train_args
from test_train import make_target, recipe_argv, write_conversations

HARNESS = Path(__file__).parent / "kill_harness.py"
# write points of each command as measured (tests/kill_harness.py prints them): the kill lands within them
POINTS = {"train": 17, "export": 5, "regenerate": 4, "recipe": 16}


def lilicorr(at: int, sig: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parent))
    return subprocess.run(
        [sys.executable, str(HARNESS), str(at), sig, "--", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def point(command: str, sig: str) -> int:
    return random.Random(f"{SEED}:{command}:{sig}").randint(1, POINTS[command])


def temporaries(root: Path) -> list:
    return [p for p in root.rglob("*") if ownership.is_temporary(p)]


def killed(result, sig: str) -> bool:
    if sig == "SIGINT":  # one line, by the rule
        return result.returncode == 130 and "error: interrupted (SIGINT): " in result.stderr
    return result.returncode == -9


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


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_killed_export_leaves_the_old_or_the_new_draft(ws, tmp_path, sig):
    from sglang_lilicorr.drafter import load_draft

    old_run, new_run, draft, expected = tmp_path / "old", tmp_path / "new", tmp_path / "draft", tmp_path / "expected"
    assert (
        main(train_args(ws, old_run, "--max-steps", "1")) == 0
        and main(train_args(ws, new_run, "--max-steps", "2")) == 0
    )
    assert main(["export", str(old_run), str(draft)]) == 0 and main(["export", str(new_run), str(expected)]) == 0
    old, new = snapshot(draft), snapshot(expected)
    result = lilicorr(point("export", sig), sig, "export", new_run, draft)
    assert killed(result, sig), result.stderr[-2000:]
    now = snapshot(draft)
    assert {k: v for k, v in now.items() if not k.startswith(".")} in (old, new)
    load_draft(draft)  # whichever it is, it loads (its checksum checked)
    if sig == "SIGINT":
        assert sorted(now) == ["config.json", "model.safetensors"] and not temporaries(tmp_path)
    assert lilicorr(10**6, sig, "export", new_run, draft).returncode == 0
    assert sorted(snapshot(draft)) == ["config.json", "model.safetensors"] and not temporaries(tmp_path)


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
    result = lilicorr(point("export", "SIGKILL"), "SIGKILL", "export", run, draft)
    assert killed(result, "SIGKILL"), result.stderr[-2000:]
    if draft.exists():
        load_draft(draft)  # appeared whole
    assert lilicorr(10**6, "SIGKILL", "export", run, draft).returncode == 0
    assert sorted(snapshot(draft)) == ["config.json", "model.safetensors"] and not temporaries(tmp_path)
