"""`lilicorr bench report` on bad input: it never writes its inputs, refuses missing or empty ones with
nothing overwritten, and reads a torn last line as absent (with a warning) without cutting it."""

import json

import pytest

from sglang_lilicorr import cli
from sglang_lilicorr.bench import runner
from sglang_lilicorr.bench.metrics import ResultsError


def record(prompt_id: str, tokens: int = 12, blocks: int = 4) -> dict:
    return {
        "system": "lilicorr",
        "dataset": "d",
        "concurrency": 1,
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": 16,
        "prompt_id": prompt_id,
        "category": "c",
        "turns": [{"completion_tokens": tokens, "spec_verify_ct": blocks, "start": 1.0, "end": 2.0, "text": "x"}],
    }


def lines(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@pytest.fixture
def report_dir(tmp_path):
    """A report folder holding a good earlier report (marked as one, as `bench report` leaves it)."""
    from sglang_lilicorr.ownership import claim_report_folder

    out = claim_report_folder(tmp_path / "report")
    (out / "summary.json").write_text('{"cells": ["the good report"]}')
    (out / "report.md").write_text("the good report")
    return out


def report(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["bench", "report", "--no-plots", *map(str, argv)])
    return code, capsys.readouterr().err


def test_a_missing_input_is_refused_and_nothing_is_overwritten(tmp_path, report_dir, capsys):
    before = {p.name: p.read_bytes() for p in report_dir.iterdir()}
    code, err = report(capsys, tmp_path / "missing.jsonl", "--out", report_dir)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "missing.jsonl is not a file" in err
    assert {p.name: p.read_bytes() for p in report_dir.iterdir()} == before


@pytest.mark.parametrize("content", [b"", b"\n\n"], ids=["empty", "blank-lines"])
def test_an_empty_input_is_refused_and_nothing_is_overwritten(tmp_path, report_dir, capsys, content):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(content)
    before = {p.name: p.read_bytes() for p in report_dir.iterdir()}
    code, err = report(capsys, empty, "--out", report_dir)
    assert code == 1 and "holds no results" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in report_dir.iterdir()} == before
    assert empty.read_bytes() == content


def test_a_last_line_without_newline_is_read_and_not_rewritten(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    data = lines(record("a")) + json.dumps(record("b", tokens=30, blocks=5)).encode()  # no trailing newline
    path.write_bytes(data)
    assert [r["prompt_id"] for r in runner.read_results(path)] == ["a", "b"]
    code, _ = report(capsys, path, "--out", tmp_path / "out")
    assert code == 0 and path.read_bytes() == data
    (cell,) = json.loads((tmp_path / "out" / "summary.json").read_text())["cells"]
    assert cell["tau"] == pytest.approx((12 + 30) / (4 + 5))  # the last record counts


def test_a_torn_last_line_is_absent_with_a_warning_and_the_file_untouched(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    data = lines(record("a"), record("b")) + b'{"system": "lilicorr", "tu'
    path.write_bytes(data)
    capsys.readouterr()
    assert [r["prompt_id"] for r in runner.read_results(path)] == ["a", "b"]
    warning = capsys.readouterr().err
    assert warning.startswith("warning: ") and "r.jsonl:3 is a torn last line" in warning
    code, err = report(capsys, path, "--out", tmp_path / "out")
    assert code == 0 and "torn last line" in err and path.read_bytes() == data


def test_a_bad_line_before_the_last_is_an_error_naming_it(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(lines(record("a")) + b"not json\n" + lines(record("b")))
    with pytest.raises(ResultsError, match=r"r.jsonl:2\): fix or remove that line"):
        runner.read_results(path)
    path.write_bytes(lines(record("a"), {**record("b"), "turns": []}))
    with pytest.raises(ResultsError, match=r"`turns` is empty \(.*r.jsonl:2\)"):
        runner.read_results(path)


def test_report_never_writes_over_its_input(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_bytes(lines(record("a")))
    out = tmp_path / "out"
    assert report(capsys, path, "--out", out)[0] == 0
    summary = (out / "summary.json").read_bytes()
    code, err = report(capsys, out / "summary.json", "--out", out)
    assert code == 2 and "is an input and would be overwritten" in err
    assert (out / "summary.json").read_bytes() == summary


def test_a_run_cuts_only_its_own_torn_line_and_completes_a_whole_one(tmp_path):
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(lines(record("a")) + b'{"sys')
    runner.open_for_append(torn).close()
    assert torn.read_bytes() == lines(record("a"))
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(lines(record("a")) + json.dumps(record("b")).encode())
    with runner.open_for_append(whole) as out:
        out.write(json.dumps(record("c")) + "\n")
    assert [r["prompt_id"] for r in runner.read_results(whole)] == ["a", "b", "c"]


def test_the_baselines_are_columns_beside_the_other_systems(tmp_path, capsys):
    """Rows of domino and dspark servers (docs/BASELINES.md) are read like any system's: one column each, side by
    side."""
    files = []
    for system, blocks in (("ar", None), ("dflash", 6), ("lilicorr", 4), ("domino", 5), ("dspark", 5), ("builtin", 4)):
        row = {**record("a", blocks=blocks or 1), "system": system}
        if blocks is None:
            del row["turns"][0]["spec_verify_ct"]
        files.append(tmp_path / f"{system}.jsonl")
        files[-1].write_bytes(lines(row))
    code, err = report(capsys, *files, "--baseline", "ar", "--block-ref", "dflash", "--out", tmp_path / "out")
    assert code == 0, err
    table = (tmp_path / "out" / "report.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| ") and "domino" in line)
    assert [header.index(s) for s in ("ar (", "builtin", "dflash", "domino", "dspark", "lilicorr")] == sorted(
        header.index(s) for s in ("ar (", "builtin", "dflash", "domino", "dspark", "lilicorr")
    )
