"""benchmarks/corrector_bench.py on the CPU (--smoke: toy shapes, eager): every row timed through SGLang's Domino and
DSpark functions and our two walks, the derived heads, and its argument errors."""

import json

import pytest

from sglang_lilicorr.benchmarks import corrector_bench


@pytest.mark.sglang
def test_smoke_times_every_row(tmp_path):
    pytest.importorskip("sglang")
    out = tmp_path / "cb.json"
    assert corrector_bench.main(["--smoke", "--bs", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    names = ("lm_head", "domino_select", "dspark_markov", "dspark_confidence", "lilicorr_greedy", "lilicorr_viterbi")
    assert doc["errors"] == {} and all(row[n] > 0 for n in names)
    assert row["domino_head"] == pytest.approx(row["domino_select"] - row["lm_head"])
    assert row["viterbi_over_greedy"] == pytest.approx(row["lilicorr_viterbi"] / row["lilicorr_greedy"])


@pytest.mark.parametrize("argv, message", [(["--bs", "0"], "--bs 0 is not a batch size"), ([], "no CUDA device")])
def test_bad_arguments_are_named(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        corrector_bench.main(
            [*argv, "--smoke" if argv else "--rep-ms", *([] if argv else ["10"]), "--out", str(tmp_path / "x")]
        )
    assert e.value.code == 2 and message in capsys.readouterr().err
