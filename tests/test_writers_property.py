"""Every writer against random existing folder contents and random file bytes (hypothesis): whatever it answers,
nothing it did not create changes. Few examples each, so the suite keeps its time on 2 cores; replay a
failure with the seed hypothesis prints."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from benchmarks.served import load_faults
from sglang_lilicorr import ownership
from sglang_lilicorr.cli import main
from stub_server import bench_run_argv
from test_export_safety import snapshot, write_run
from test_train import make_target, recipe_argv, train_argv, write_conversations

# names a user's folder may well hold, the ones our writers write among them
NAMES = [
    "metrics.jsonl",
    "latest",
    "config.json",
    "model.safetensors",
    "train.jsonl",
    "heldout.jsonl",
    "manifest.json",
    "conversations.jsonl",
    "summary.json",
    "report.md",
    "notes.txt",
    ".hidden",
    ".lilicorr.json",
    "snapshots/.keep",
    "checkpoints/step-00000002/train_state.json",
    "logs/server-0.log",
    "sub/data.bin",
]
BYTES = st.one_of(
    st.binary(max_size=64),
    st.lists(
        st.dictionaries(
            st.sampled_from(["id", "step", "kind", "messages", "turns", "system"]),
            st.one_of(st.integers(), st.text(max_size=6), st.none()),
            max_size=3,
        ),
        max_size=3,
    ).map(lambda rows: "".join(json.dumps(r) + "\n" for r in rows).encode()),
)
FOLDER = st.dictionaries(st.sampled_from(NAMES), BYTES, min_size=1, max_size=5)
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("writers")
    exclude = root / "eval.jsonl"
    exclude.write_text('{"id": "e", "text": "what is two plus two"}\n')
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "hi"}\n')
    return {
        "target": make_target(root / "target"),
        "data": write_conversations(root / "data.jsonl", 8),
        "run": write_run(root / "run"),
        "exclude": str(exclude),
        "prompts": str(prompts),
        "root": root,
    }


def fill(folder: Path, files: dict) -> dict:
    """`folder` holding `files` (a name that is a folder elsewhere in the dict wins as a folder) -> its snapshot."""
    for name, data in sorted(files.items(), key=lambda kv: kv[0].count("/"), reverse=True):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(data)
    return snapshot(folder)


def assert_kept(folder: Path, before: dict) -> None:
    after = snapshot(folder)
    assert {k: after.get(k) for k in before} == before, "a file the command did not write changed or went"
    assert not [p for p in folder.rglob("*") if ownership.is_temporary(p)], "temporaries left behind"


def run_in_fresh(tmp_root: Path, files: dict, command) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_root))
    try:
        before = fill(work / "dest", files)
        code = command(work / "dest")
        assert code in (0, 1, 2)
        assert_kept(work / "dest", before)
    finally:
        shutil.rmtree(work)


def train_one_step(ws, out) -> int:
    return main(train_argv(ws["target"], ws["data"], out, "--max-steps", "1"))


@SETTINGS
@given(files=FOLDER)
def test_train_output_dir(ws, files):
    run_in_fresh(ws["root"], files, lambda out: train_one_step(ws, out))


OTHERS = st.dictionaries(
    st.sampled_from(
        [
            "notes.txt",
            ".hidden",
            "snapshots/.keep",
            "snapshots/mine.safetensors",
            "sub/data.bin",
            "checkpoints/README",
            "train.log",
        ]
    ),
    BYTES,
    min_size=1,
    max_size=4,
)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(files=OTHERS)
def test_train_in_its_own_run_touches_only_its_files(ws, files):
    """A run folder (marked) with the user's files beside the run's: training writes its own files only."""

    def command(out):
        ownership.mark(out, "run")  # a run of ours that the user put files into
        return train_one_step(ws, out)

    run_in_fresh(
        ws["root"], files, lambda out: (lambda code: code if code == 0 else pytest.fail(f"exit {code}"))(command(out))
    )


@SETTINGS
@given(files=FOLDER, force=st.booleans())
def test_export_out_dir(ws, files, force):
    run_in_fresh(ws["root"], files, lambda out: main(["export", str(ws["run"]), str(out)] + ["--force"] * force))


@SETTINGS
@given(files=FOLDER)
def test_regenerate_recipe_output_dir(ws, files):
    run_in_fresh(ws["root"], files, lambda out: main(recipe_argv(ws["target"], out, ws["exclude"], 1)))


def results_file(ws) -> Path:
    results = ws["root"] / "results.jsonl"
    if not results.exists():
        record = {
            "system": "s",
            "dataset": "d",
            "concurrency": 1,
            "temperature": 0.0,
            "seed": 0,
            "max_tokens": 8,
            "prompt_id": "a",
            "category": "c",
            "turns": [{"completion_tokens": 4, "start": 0.0, "end": 1.0, "spec_verify_ct": 2}],
        }
        results.write_text(json.dumps(record) + "\n")
    return results


@SETTINGS
@given(files=FOLDER, command=st.sampled_from(["report", "faults", "replay"]))
def test_report_out_dirs(ws, files, command):
    draft = ws["root"] / "draft"
    if command == "replay" and not draft.exists():
        assert main(["export", str(ws["run"]), str(draft)]) == 0
    argv = {
        "report": lambda out: ["bench", "report", str(results_file(ws)), "--no-plots", "--out", str(out)],
        "faults": lambda out: [  # the lab's step (python -m benchmarks faults)
            "--url",
            "http://127.0.0.1:9",
            "--duration",
            "0.2",
            "--clients",
            "1",
            "--out",
            str(out),
        ],
        "replay": lambda out: [
            "replay",
            "--target",
            ws["target"],
            "--draft",
            f"d={draft}",
            "--outputs",
            ws["data"],
            "--out",
            str(out),
        ],
    }[command]
    run = load_faults.main if command == "faults" else main
    run_in_fresh(ws["root"], files, lambda out: run(argv(out)))


@SETTINGS
@given(data=BYTES)
def test_compare_out_file(ws, data):
    work = Path(tempfile.mkdtemp(dir=ws["root"]))
    try:
        out = work / "rows.json"
        out.write_bytes(data)
        main(["bench", "compare", str(results_file(ws)), str(results_file(ws)), "--out", str(out)])
        assert out.read_bytes() == data or not data  # an empty file may be written; anything else is left as it was
    finally:
        shutil.rmtree(work)


@SETTINGS
@given(data=BYTES)
def test_append_files_results_and_rows(ws, data):
    """bench run --results and regenerate --output: random bytes in the file, the server down / nothing to play."""
    work = Path(tempfile.mkdtemp(dir=ws["root"]))
    try:
        for name, command in (
            (
                "results.jsonl",
                lambda f: bench_run_argv(ws["prompts"], f, "--no-progress", "--warmup", "0"),
            ),
            (
                "rows.jsonl",
                lambda f: [
                    "regenerate",
                    "--target",
                    ws["target"],
                    "--prompts",
                    str(f.parent / "none.jsonl"),
                    "--output",
                    str(f),
                    "--engine",
                    "transformers",
                ],
            ),
        ):
            path = work / name
            path.write_bytes(data)
            assert main(command(path)) in (1, 2)
            assert path.read_bytes() == data
    finally:
        shutil.rmtree(work)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.binary(max_size=80), tail=st.sampled_from([b"", b"\n", b'{"id": "x", "tu', b"\xff"]))
def test_jsonl_for_append_reads_only_and_cuts_only_in_its_own_kind(tmp_path_factory, data, tail):
    path = tmp_path_factory.mktemp("j") / "f.jsonl"
    rows = b'{"id": "a", "reason": "r"}\n'
    for content in (data + tail, rows + data + tail):
        path.write_bytes(content)
        try:
            cut = ownership.jsonl_for_append(path, lambda v: isinstance(v, dict) and "id" in v, "rows", "--output")
        except ownership.LiLiCorrError:
            assert path.read_bytes() == content
            continue
        assert path.read_bytes() == content  # reads only
        if cut is not None:  # only behind at least one whole record, and only the last line
            assert content[:cut].endswith(b"\n") and b"\n" not in content[cut:] and cut > 0
