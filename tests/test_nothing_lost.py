"""No command deletes, truncates or takes over what it did not write. The five reproductions, each from a
clean folder (`target/` a tiny model, `data.jsonl` a few conversations, small training flags), the resume checks
and the exit-code rule (2: an argument that cannot work; 1: bad content or a failed run), through `lilicorr`."""

import json
from pathlib import Path

import pytest
import torch

from sglang_lilicorr.cli import main
from stub_server import bench_run_argv
from test_export_safety import snapshot
from test_train import make_target, recipe_argv, train_argv, write_conversations


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("lost")
    return {
        "target": make_target(root / "target"),
        "data": write_conversations(root / "data.jsonl", 8),
        "other_data": write_conversations(root / "other.jsonl", 8, seed=1),
        "root": root,
    }


def train_args(ws, out, *extra, data=None):
    return train_argv(ws["target"], data or ws["data"], out, "--log-every", "1", "--save-every", "2", *extra)


def error_line(capsys) -> str:
    """The one error line of the last command (progress bars of model loading may come before it)."""
    err = capsys.readouterr().err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in err and "this is a bug" not in err, err
    return last


def shaped(line: str) -> bool:
    """`error: <what> (<where>): <fix>`"""
    head, _, fix = line.partition("): ")
    return bool(fix) and " (" in head


# --- 1. export --force over a folder that holds a training run or a model: tests/test_export_safety.py -----------


# --- 2. bench run --results a file that is not a results file, server down --------------------------------------


@pytest.mark.parametrize(
    "content",
    [b'{"not": "a result"}', b"one line of notes", b"\x00\x01safetensors\xff" * 40, b'{"a": 1}\n{"b": 2}\n{"torn'],
    ids=["json", "text", "binary", "torn"],
)
def test_bench_run_never_touches_a_file_that_is_not_a_results_file(tmp_path, capsys, content):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "hi"}\n')
    summary = tmp_path / "rep" / "summary.json"
    summary.parent.mkdir()
    summary.write_bytes(content)
    code = main(bench_run_argv(prompts, summary, "--no-progress"))
    line = error_line(capsys)
    assert code == 2 and "is not a results file" in line and shaped(line), line
    assert summary.read_bytes() == content


def test_bench_run_values_that_cannot_work_exit_2(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "hi"}\n')
    for flag, value in (("--concurrency", "0"), ("--max-tokens", "0"), ("--temperature", "-1")):
        code = main(bench_run_argv(prompts, tmp_path / "r.jsonl", flag, value, "--no-progress"))
        line = error_line(capsys)
        assert code == 2 and flag in line and shaped(line), line
    assert not (tmp_path / "r.jsonl").exists()
    code = main(bench_run_argv(tmp_path / "none.jsonl", tmp_path / "r.jsonl", "--no-progress"))
    assert code == 2 and "none.jsonl" in error_line(capsys)


# --- 3. train --output-dir an unrelated folder -----------------------------------------------------------------


def test_train_never_takes_over_a_folder_it_did_not_make(ws, tmp_path, capsys):
    proj = tmp_path / "proj"
    (proj / "snapshots").mkdir(parents=True)
    (proj / "metrics.jsonl").write_text('{"accuracy": 0.9}\n{"accuracy": 0.95}\n')
    (proj / "snapshots" / ".keep").write_text("")
    (proj / "snapshots" / ".notes.tmp").write_text("mine")
    before = snapshot(proj)
    code = main(train_args(ws, proj, "--max-steps", "2"))
    line = error_line(capsys)
    assert code == 2 and "is not a training run" in line and "metrics.jsonl" in line and shaped(line), line
    assert snapshot(proj) == before and sorted(p.name for p in (proj / "snapshots").iterdir()) == [
        ".keep",
        ".notes.tmp",
    ]


def test_train_inputs_that_cannot_work_exit_2(ws, tmp_path, capsys):
    for bad in (["--data", str(tmp_path / "missing.jsonl")], ["--eval-examples", "1000"]):
        args = train_args(ws, tmp_path / "run", "--max-steps", "1")
        i = args.index(bad[0])
        args[i + 1] = bad[1]
        code = main(args)
        line = error_line(capsys)
        assert code == 2 and bad[0] in line and shaped(line), line
    assert not (tmp_path / "run" / "checkpoints").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "not a list"}\n')
    assert main(train_args(ws, tmp_path / "run2", "--max-steps", "1", data=str(bad))) == 1  # bad content: 1
    error_line(capsys)


# --- 4. regenerate --recipe --output-dir a folder with the user's train.jsonl ----------------------------------


def test_regenerate_never_replaces_a_data_file_it_did_not_write(ws, tmp_path, capsys):
    mydata = tmp_path / "mydata"
    mydata.mkdir()
    (mydata / "train.jsonl").write_text("".join(json.dumps({"id": i, "text": "mine"}) + "\n" for i in range(30)))
    exclude = tmp_path / "eval.jsonl"
    exclude.write_text('{"id": "e", "text": "what is two plus two"}\n')
    before = snapshot(mydata)
    code = main(recipe_argv(ws["target"], mydata, exclude, 2, max_new_tokens=4))
    line = error_line(capsys)
    assert code == 2 and "is not a data set made by `lilicorr regenerate --recipe`" in line and shaped(line), line
    assert snapshot(mydata) == before
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my notes, one line")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "hi"}\n')
    code = main(
        [
            "regenerate",
            "--target",
            ws["target"],
            "--prompts",
            str(prompts),
            "--output",
            str(notes),
            "--engine",
            "transformers",
        ]
    )
    assert code == 2 and "is not a file of `lilicorr regenerate` rows" in error_line(capsys)
    assert notes.read_text() == "my notes, one line"


# --- 5. a run whose checkpoints are damaged -------------------------------------------------------------------


def metrics_rows(run: Path) -> list:
    return (run / "metrics.jsonl").read_text().splitlines()


def test_a_run_whose_only_checkpoint_is_truncated_stops_and_keeps_everything(ws, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(ws, run, "--max-steps", "2", "--keep-checkpoints", "1")) == 0
    weights = run / "checkpoints" / "step-00000002" / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = snapshot(run)
    capsys.readouterr()
    code = main(train_args(ws, run, "--max-steps", "4", "--keep-checkpoints", "1"))
    line = error_line(capsys)
    assert code == 1 and "no checkpoint of this run loads" in line and shaped(line), line
    assert "--no-resume --move-aside" in line and "moved beside it, whole" in line  # never deleted
    assert snapshot(run) == before  # not restarted: metrics and the checkpoint as they were
    assert main(["export", str(run), str(tmp_path / "draft")]) == 1 and "truncated" in error_line(capsys)
    assert not (tmp_path / "draft").exists()


def test_flipped_bytes_are_caught_on_export_and_resume_falls_back(ws, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(ws, run, "--max-steps", "4")) == 0  # checkpoints at 2 and 4
    weights = run / "checkpoints" / "step-00000004" / "trainable.safetensors"
    data = bytearray(weights.read_bytes())
    for i in range(64):  # 64 bytes in the tensor data (past the header) flipped
        data[-1 - 37 * i] ^= 0xFF
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "draft")]) == 1
    assert "does not match its checksum" in error_line(capsys)
    rows = metrics_rows(run)
    assert main(train_args(ws, run, "--max-steps", "6")) == 0
    err = capsys.readouterr().err
    assert (
        "does not match its checksum" in err
        and "step-00000004/trainable.safetensors)" in err
        and "step-00000002" in err
    )
    assert [json.loads(r)["step"] for r in metrics_rows(run)] == [1, 2, 3, 4, 5, 6] and metrics_rows(run)[:2] == rows[
        :2
    ]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "bad-step-00000004",
        "step-00000004",
        "step-00000006",
    ]
    optimizer = run / "checkpoints" / "step-00000006" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # truncated: the run falls back to step 4
    assert main(train_args(ws, run, "--max-steps", "8")) == 0
    err = capsys.readouterr().err
    assert "does not match the sha256" in err and "step-00000006/optimizer.pt)" in err and "unexpected" not in err


def test_resume_refuses_other_data_or_settings_unless_told(ws, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(ws, run, "--max-steps", "2")) == 0
    before = snapshot(run)
    capsys.readouterr()
    for args in (
        train_args(ws, run, "--max-steps", "4", data=ws["other_data"]),
        train_args(ws, run, "--max-steps", "4", "--lr-head", "1e-3"),
    ):
        code = main(args)
        line = error_line(capsys)
        assert code == 2 and "cannot resume" in line and "--resume-with-changes" in line and shaped(line), line
    assert snapshot(run) == before
    assert main(train_args(ws, run, "--max-steps", "4", "--resume-with-changes", data=ws["other_data"])) == 0
    assert (run / "latest").read_text().strip() == "step-00000004"


def test_the_checksum_lives_in_the_safetensors_metadata_and_tensors_are_unchanged(ws, tmp_path):
    """Stock loaders read an export as before: the same tensor names, shapes and data; the checksum is metadata."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from sglang_lilicorr.checkpoint import CHECKSUM_KEY, tensor_digest
    from sglang_lilicorr.drafter import load_draft

    run = tmp_path / "run"
    assert main(train_args(ws, run, "--max-steps", "1")) == 0
    assert main(["export", str(run), str(tmp_path / "draft")]) == 0
    weights = tmp_path / "draft" / "model.safetensors"
    tensors = load_file(str(weights))
    with safe_open(str(weights), "pt") as f:
        assert f.metadata()[CHECKSUM_KEY] == tensor_digest(tensors)
    drafter, head = load_draft(tmp_path / "draft")
    expected = {**drafter.state_dict(), **{f"lilicorr.{k}": v for k, v in head.state_dict().items()}}
    assert sorted(tensors) == sorted(expected) and all(torch.equal(tensors[k], expected[k]) for k in tensors)


def test_a_foreign_file_where_the_token_cache_goes_is_left_alone(ws, tmp_path):
    data = tmp_path / "conversations.jsonl"
    data.write_text(Path(ws["data"]).read_text())
    cache = tmp_path / "conversations.jsonl.tokens.pt"
    cache.write_bytes(b"my own file, not a cache")
    assert main(train_args(ws, tmp_path / "run", "--max-steps", "1", data=str(data))) == 0
    assert cache.read_bytes() == b"my own file, not a cache"


def test_regenerate_claims_its_folder_before_the_servers_write_their_logs(ws, tmp_path, monkeypatch):
    """On a GPU the servers' logs go into OUTPUT/logs first: the folder is the data set's by then."""
    import contextlib

    from sglang_lilicorr.commands import train as train_cli

    real = train_cli.generator_for

    @contextlib.contextmanager
    def with_logs(args, tokenizer, log_dir):
        log_dir.mkdir(parents=True)
        (log_dir / "server-0.log").write_text("started")
        with real(args, tokenizer, log_dir) as pair:
            yield pair

    monkeypatch.setattr(train_cli, "generator_for", with_logs)
    exclude = tmp_path / "eval.jsonl"
    exclude.write_text('{"id": "e", "text": "what is two plus two"}\n')
    assert main(recipe_argv(ws["target"], tmp_path / "data", exclude, 2)) == 0
    assert (tmp_path / "data" / "manifest.json").is_file() and (tmp_path / "data" / "logs" / "server-0.log").is_file()
