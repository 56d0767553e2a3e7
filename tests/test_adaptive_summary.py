"""`python -m benchmarks adaptive-summary` on fabricated speed summaries of both prompt sets: per set and c the tok/s,
adaptive_vs_base and adaptive_vs_fixed as [mean, lo, hi], width shares, worst greedy ulps (null where the rounds
recorded no token ids), card and commit; summary.md, the plot, the targets a cell misses, and what it refuses."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import main as lab  # noqa: E402
from benchmarks.served import adaptive_summary  # noqa: E402


def entry(base, lilicorr, fixed, vs_base, vs_fixed, fixed_vs_base, tiers, greedy=None, tau=1.7) -> dict:
    """One concurrency of serve_speed.summarize's output (and speed --greedy-check's `greedy`)."""
    e = {
        "base": base,
        "dflash": base * 0.8,
        "builtin": base * 0.9,
        "lilicorr": lilicorr,
        "lilicorr_fixed": fixed,
        "lilicorr_vs_base": vs_base,
        "lilicorr_vs_lilicorr_fixed": vs_fixed,
        "lilicorr_fixed_vs_base": fixed_vs_base,
        "lilicorr_vs_builtin": [1.1, 1.0, 1.2],
        "tau": {"dflash": 1.5, "builtin": 1.6, "lilicorr": tau, "lilicorr_fixed": tau},
        "tiers": {"lilicorr": tiers, "lilicorr_fixed": {"16": 1.0}},
        "rounds": 5,
    }
    if greedy is not None:
        e["greedy"] = {
            s: {
                "worst_ulps": u,
                "beyond_tol": 0,
                "replies": 16,
                "checked": 16,
                "tokens": 4000,
                "tokens_beyond_tol": u > 2,
            }
            for s, u in greedy.items()
        }
    return e


def speed_folder(tmp_path, name, prompt_set, summary) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    doc = {"setting": "graphs64", "folder": name, "graphs_to": 64, "backends": {"attention": "triton"}}
    doc.update(summary=summary, **({"prompt_set": prompt_set} if prompt_set else {}))
    (folder / "speed_summary.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture
def folders(tmp_path):
    writing = speed_folder(
        tmp_path,
        "graphs64",
        None,  # a summary from before --prompt-set: the writing set
        {
            "1": entry(600, 690, 560, [1.15, 1.12, 1.18], [1.23, 1.2, 1.26], [0.93, 0.9, 0.96], {"16": 1.0}),
            "64": entry(
                20000, 19000, 14000, [0.95, 0.9, 1.0], [1.36, 1.3, 1.4], [0.7, 0.68, 0.72], {"1": 0.9, "16": 0.1}
            ),
        },
    )
    evals = speed_folder(
        tmp_path,
        "graphs64_eval",
        "eval",
        {
            "1": entry(
                600,
                600,
                500,
                [1.0, 0.99, 1.01],
                [1.2, 1.1, 1.3],
                [0.83, 0.8, 0.86],
                {"1": 0.5, "4": 0.5},
                greedy={},
                tau=2.1,  # the evaluation sets drafted better than the writing set: the c = 1 speed-up is theirs
            ),
            "8": entry(
                3000,
                3000,
                2900,
                [1.0, 0.96, 1.04],
                [1.03, 1.0, 1.06],
                [0.97, 0.95, 0.99],
                {"16": 1.0},
                greedy={"base": 2.6, "lilicorr": 6.4, "lilicorr_fixed": 1.0},
            ),
        },
    )
    return writing, evals


def test_the_summary_holds_both_sets_per_concurrency_with_card_and_commit(tmp_path, folders, capsys):
    writing, evals = folders
    out = tmp_path / "adaptive"
    argv = ["adaptive-summary", "--writing", str(writing), "--eval", str(evals), "--card", "H100", "--commit", "abc"]
    assert lab([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "summary.json").read_text())
    assert result["card"] == "H100" and result["commit"] == "abc"
    assert list(result["writing"]["cells"]) == ["1", "64"] and list(result["eval"]["cells"]) == ["1", "8"]
    one = result["writing"]["cells"]["1"]
    assert one["tok_s"] == {"base": 600, "dflash": 480, "builtin": 540, "lilicorr": 690, "lilicorr_fixed": 560}
    assert one["adaptive_vs_base"] == [1.15, 1.12, 1.18] and one["adaptive_vs_fixed"] == [1.23, 1.2, 1.26]
    assert one["tiers"]["lilicorr"] == {"16": 1.0} and one["rounds"] == 5
    assert one["width1_vs_base"] is None  # lilicorr_w1 (the adaptive width's floor) did not play
    assert one["worst_ulps"] == dict.fromkeys(["base", "dflash", "builtin", "lilicorr", "lilicorr_fixed"])
    eight = result["eval"]["cells"]["8"]
    assert eight["worst_ulps"] == {"base": 2.6, "dflash": None, "builtin": None, "lilicorr": 6.4, "lilicorr_fixed": 1.0}
    rates = {"base": 2.5, "dflash": None, "builtin": None, "lilicorr": 2.5, "lilicorr_fixed": 0.0}
    assert eight["beyond_tol_per_10k"] == rates and set(one["beyond_tol_per_10k"].values()) == {None}
    assert result["eval"]["folder"] == "graphs64_eval" and result["writing"]["graphs_to"] == 64
    assert result["high_tau_set"] == "eval"
    assert result["missed"] == [
        "writing c=64: adaptive_vs_base 0.950 < 0.98",
        "writing c=64: adaptive_vs_base lower bound 0.900 < 0.95",
        "eval c=1: adaptive_vs_base 1.000 <= 1.1",
        "eval c=8: LILICORR's worst deviation 6.40 ulps > no speculation's",
    ]
    md = (out / "summary.md").read_text()
    assert "## writing (graphs64)" in md and "## eval (graphs64_eval)" in md
    assert "| 64 | 20000 | 16000 | 18000 | 19000 | 14000 | 0.950 [0.900, 1.000] | 1.360 [1.300, 1.400] |" in md
    assert "| 1: 0.90, 16: 0.10 |" in md and "| 2.60 / - / - / 6.40 / 1.00 | 2.5 / - / - / 2.5 / 0.0 |" in md
    assert "- writing c=64: adaptive_vs_base 0.950 < 0.98" in md
    # the cells: both sets at c = 1, 4, 8, 16, 32, 64, each on at least 5 rounds
    assert result["unmeasured"][:4] == [
        "writing c=4: not played",
        "writing c=8: not played",
        "writing c=16: not played",
        "writing c=32: not played",
    ]
    assert "- eval c=64: not played" in md
    assert (out / "adaptive.png").stat().st_size > 1000
    # one set alone
    assert lab(["adaptive-summary", "--eval", str(evals), "--card", "H100", "--commit", "abc", "--out", str(out)]) == 0
    alone = json.loads((out / "summary.json").read_text())
    assert "writing" not in alone and alone["high_tau_set"] is None and alone["unmeasured"][0] == "writing: not played"


def test_targets_are_checked_per_cell():
    x = adaptive_summary.cell(
        entry(600, 690, 560, [1.10, 1.05, 1.15], [0.97, 0.9, 1.0], [0.85, 0.8, 0.9], {"16": 1.0}, {"base": 1.0})
    )
    assert adaptive_summary.missed("writing", "1", x, high_tau=True) == [
        "writing c=1: adaptive_vs_base 1.100 <= 1.1",
        "writing c=1: adaptive_vs_fixed 0.970 < 0.98",
        "writing c=1: fixed width 0.850 of no speculation, adaptive_vs_fixed 0.970 < 1.2",
    ]
    assert adaptive_summary.missed("eval", "1", x) == [
        "eval c=1: adaptive_vs_fixed 0.970 < 0.98",
        "eval c=1: fixed width 0.850 of no speculation, adaptive_vs_fixed 0.970 < 1.2",
    ]
    without_fixed = {**x, "adaptive_vs_fixed": None, "fixed_vs_base": None}
    assert adaptive_summary.missed("eval", "8", without_fixed) == []


def test_a_folder_of_the_other_set_or_without_a_summary_is_refused(tmp_path, folders, capsys):
    writing, evals = folders
    common = ["--card", "H100", "--commit", "abc", "--out", str(tmp_path / "out")]
    for argv, says in (
        (["--writing", str(evals)], "its rounds played the eval set; pass it as --eval"),
        (["--eval", str(tmp_path)], "no speed_summary.json there"),
        ([], "nothing to summarize"),
    ):
        with pytest.raises(SystemExit) as e:
            lab(["adaptive-summary", *argv, *common])
        assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_width_1_played_beside_gives_the_adaptive_widths_floor():
    e = {**entry(600, 690, 560, [1.15, 1.12, 1.18], [1.23, 1.2, 1.26], [0.93, 0.9, 0.96], {"16": 1.0})}
    e |= {"lilicorr_w1": 480, "lilicorr_w1_vs_base": [0.8, 0.78, 0.82]}
    x = adaptive_summary.cell(e)
    assert x["width1_vs_base"] == [0.8, 0.78, 0.82] and x["tok_s"]["lilicorr_w1"] == 480
