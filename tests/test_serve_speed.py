"""The served-speed summary (benchmarks/served/serve_speed.py): paired ratios within rounds, tau, the start-up lines of
SGLang's logs, the results file, and the idle servers' CPU accounting."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.served import serve_speed


def record(system: str, c: int, tokens: int, seconds: float, blocks: int | None) -> dict:
    turn = {"completion_tokens": tokens, "spec_verify_ct": blocks, "start": 0.0, "end": seconds, "text": ""}
    return {"system": system, "concurrency": c, "dataset": "speed", "prompt_id": "p", "turns": [turn]}


def rounds_of(speeds: dict, c: int = 1) -> list[list[dict]]:
    """speeds: {system: [tok/s of round 0, round 1, ...]} -> the rounds' records (100 tokens each, 4 per block)."""
    n = len(next(iter(speeds.values())))
    return [[record(s, c, 100, 100 / v[r], None if s == "base" else 25) for s, v in speeds.items()] for r in range(n)]


def test_ratios_are_paired_within_rounds_with_t_intervals():
    speeds = {"base": [100, 50, 100], "dflash": [100, 50, 100], "builtin": [200, 100, 200], "lilicorr": [220, 110, 220]}
    summary = serve_speed.summarize(rounds_of(speeds))["1"]
    assert summary["rounds"] == 3 and summary["lilicorr"] == pytest.approx(550 / 3, abs=0.1)
    # the whole second round ran at half speed: paired ratios do not move, so their interval is a point
    assert summary["lilicorr_vs_builtin"] == [1.1, 1.1, 1.1]
    assert summary["lilicorr_vs_dflash"] == [2.2, 2.2, 2.2]
    assert summary["tau"] == {"dflash": 4.0, "builtin": 4.0, "lilicorr": 4.0}
    # latency per block pooled over the rounds, over latency per token of no speculation pooled the same way
    block, step = (100 / 220 + 100 / 110 + 100 / 220) / 75, (1.0 + 2.0 + 1.0) / 300
    assert summary["block_over_decode"]["lilicorr"] == pytest.approx(block / step, abs=1e-3)
    noisy = serve_speed.summarize(rounds_of({**speeds, "lilicorr": [220, 100, 180]}))["1"]["lilicorr_vs_builtin"]
    assert noisy[1] < noisy[0] < noisy[2] and noisy[0] == pytest.approx((1.1 + 1.0 + 0.9) / 3, abs=1e-4)


def test_a_concurrency_missing_a_system_is_left_out():
    rounds = rounds_of({"base": [100], "dflash": [100], "builtin": [100], "lilicorr": [100]})
    rounds[0] += [record("lilicorr", 8, 100, 1.0, 25)]  # c = 8 has only one system
    assert list(serve_speed.summarize(rounds)) == ["1"]


def test_a_lean_set_of_no_speculation_and_lilicorr_widths_is_summarized():
    """Only base and lilicorr are required: the adaptive width's calls leave the other engines out."""
    lean = {"base": [100, 50], "lilicorr": [120, 60], "lilicorr_fixed": [100, 50], "lilicorr_w1": [150, 75]}
    summary = serve_speed.summarize(rounds_of(lean))["1"]
    assert summary["lilicorr_vs_base"] == [1.2, 1.2, 1.2] and summary["lilicorr_w1_vs_base"] == [1.5, 1.5, 1.5]
    assert "dflash" not in summary and "lilicorr_vs_dflash" not in summary and summary["rounds"] == 2
    assert not serve_speed.summarize(rounds_of({"base": [100], "dflash": [90]}))  # no LILICORR: no cell


def test_the_verify_variants_join_the_rounds_they_played_and_are_paired_like_the_rest(tmp_path):
    four = {"base": [100, 50], "dflash": [100, 50], "builtin": [200, 100], "lilicorr": [240, 120]}
    summary = serve_speed.summarize(rounds_of({**four, "dflash_splitkv": [150, 75], "lilicorr_extend": [200, 100]}))[
        "1"
    ]
    assert summary["dflash_splitkv_vs_dflash"] == [1.5, 1.5, 1.5] and summary["lilicorr_vs_lilicorr_extend"] == [
        1.2,
        1.2,
        1.2,
    ]
    assert summary["lilicorr_extend_vs_builtin"] == [1.0, 1.0, 1.0] and summary["lilicorr_vs_dflash_splitkv"] == [
        1.6,
        1.6,
        1.6,
    ]
    assert set(summary["tau"]) == {"dflash", "builtin", "lilicorr", "dflash_splitkv", "lilicorr_extend"}
    text = serve_speed.table({"1": summary})
    assert "DFLASH split-KV verify tok/s" in text and "lilicorr / lilicorr_extend" in text
    without = serve_speed.summarize(rounds_of(four))
    assert "dflash_splitkv" not in serve_speed.table(without) and "lilicorr_extend" not in without["1"]["tau"]
    assert serve_speed.plot({"graphs32": {"1": summary}}, tmp_path / "v.png").is_file()


def test_table_and_plot(tmp_path):
    summary = serve_speed.summarize(
        rounds_of({"base": [100, 90], "dflash": [80, 70], "builtin": [90, 80], "lilicorr": [95, 85]})
    )
    text = serve_speed.table(summary, "graphs32")
    assert "**graphs32**" in text and "| 1 | 95 | 75 | 85 | 90 |" in text and "lilicorr / builtin" in text
    assert serve_speed.plot({"graphs32": summary}, tmp_path / "s.png").is_file()


LOG = """[x] Capture target verify CUDA graph end. bs=[1, 2], elapsed=9.27 s, mem usage=2.53 GB, avail mem=70.14 GB.
[x] Capture draft verify CUDA graph end. bs=[1, 2], elapsed=44.40 s, mem usage=0.21 GB, avail mem=67.62 GB.
[x] Engine startup timings (s): load_weight=0.55, kv_cache_allocation=1.86, scheduler_e2e=77.41, \
cuda_graph={prefill=0.00}
"""
PRECOMPILE = """[x] LILICORR select, draft graphs at bs 1-32, eager proposal at bs -: 34 Triton kernels compiled \
concurrently (or read from Triton's cache) on 8 threads in 4.2 s.
[x] LILICORR select, draft graphs at bs -, eager proposal at bs 33: 2 Triton kernels compiled concurrently (or read \
from Triton's cache) on 8 threads in 0.9 s.
"""


def test_start_up_seconds_from_sglangs_log_lines():
    assert serve_speed.capture_seconds(LOG) == {
        "target verify": 9.27,
        "draft verify": 44.4,
        "total": 53.67,
        "scheduler_e2e": 77.41,
        "load_weight": 0.55,
    }
    assert serve_speed.capture_seconds(LOG + PRECOMPILE)["precompile"] == 5.1  # both passes
    assert serve_speed.capture_seconds("no such lines") == {}


def test_results_file_from_both_settings(tmp_path):
    graphs = serve_speed.summarize(
        rounds_of({"base": [100, 90], "dflash": [80, 70], "builtin": [90, 80], "lilicorr": [95, 85]})
    )
    eager = serve_speed.summarize(
        rounds_of({"base": [10, 9], "dflash": [8, 7], "builtin": [6, 5], "lilicorr": [7, 6]}, c=32)
    )
    for name, setting, summary in (("g", "graphs32", graphs), ("e", "graphs16", eager)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed_summary.json").write_text(
            json.dumps(
                {
                    "setting": setting,
                    "summary": summary,
                    "capture_s": {"c=1": {"lilicorr": serve_speed.capture_seconds(LOG)}},
                }
            )
        )
    assert (
        serve_speed.main(
            [
                "--graphs",
                str(tmp_path / "g"),
                "--eager",
                str(tmp_path / "e"),
                "--card",
                "H100",
                "--commit",
                "abc",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["card"] == "H100" and doc["commit"] == "abc" and doc["1"]["lilicorr"] == 90.0
    assert doc["eager"]["lilicorr_vs_dflash"][0] == pytest.approx((7 / 8 + 6 / 7) / 2, abs=1e-4)
    assert doc["startup_s"] == {"lilicorr": {"graph_capture": 53.67, "scheduler": 77.41}}
    assert (tmp_path / "out" / "speed.png").is_file() and "graphs16" in (tmp_path / "out" / "table.md").read_text()
    with pytest.raises(SystemExit):
        serve_speed.main(["--graphs", str(tmp_path), "--card", "x", "--commit", "y", "--out", str(tmp_path / "o2")])
    # the eager setting alone: only its cell is new, the rest (start-up included) kept from the earlier file
    only = ["--eager", str(tmp_path / "e"), "--card", "H200", "--commit", "def", "--out", str(tmp_path / "o3")]
    assert serve_speed.main([*only, "--keep-from", str(tmp_path / "out" / "summary.json")]) == 0
    kept = json.loads((tmp_path / "o3" / "summary.json").read_text())
    assert kept["eager"] == doc["eager"] and kept["1"] == doc["1"] and kept["startup_s"] == doc["startup_s"]
    assert kept["measured"] == {"1": "H100, abc", "eager": "H200, def", "startup_s": "H100, abc"}
    with pytest.raises(SystemExit):  # neither setting
        serve_speed.main(["--card", "x", "--commit", "y", "--out", str(tmp_path / "o4")])


def test_results_file_names_the_recorded_backends():
    """The speed step's backends pass into the results file; a run before them names none."""
    fi = {"attention": "flashinfer", "sampling": "flashinfer"}
    assert serve_speed.report({"summary": {}, "backends": fi}, None, "H200", "abc")["backends"] == fi
    assert serve_speed.report(None, {"summary": {}, "backends": fi}, "H200", "abc")["backends"] == fi
    assert "backends" not in serve_speed.report({"summary": {}}, None, "H200", "abc")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")
def test_process_tree_cpu_counts_a_busy_child():
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass\nprint(1)"],
        stdout=subprocess.PIPE,
    )
    before = serve_speed.process_tree_cpu_s(os.getpid())
    child.stdout.read()  # the child has spun ~0.6 s of CPU and is still alive until waited on
    spent = serve_speed.process_tree_cpu_s(os.getpid()) - before
    child.wait()
    assert spent >= 0.2


def test_a_partial_run_keeps_the_cells_it_did_not_measure():
    earlier = {
        "1": {"lilicorr": 1.0},
        "4": {"lilicorr": 4.0},
        "eager": {"lilicorr": 3.0},
        "startup_s": {"lilicorr": {"scheduler": 9.0}},
        "card": "H200",
        "commit": "old",
    }
    new = {"1": {"lilicorr": 2.0}, "startup_s": {"lilicorr": {"scheduler": 8.0}}, "card": "H200", "commit": "new"}
    doc = serve_speed.keep_unmeasured(new, earlier)
    assert doc["1"] == {"lilicorr": 2.0} and doc["4"] == {"lilicorr": 4.0} and doc["eager"] == {"lilicorr": 3.0}
    assert doc["startup_s"] == {"lilicorr": {"scheduler": 8.0}} and doc["commit"] == "new"
    assert doc["measured"] == {"1": "H200, new", "4": "H200, old", "eager": "H200, old", "startup_s": "H200, new"}
    # a third run keeps the second's attributions
    again = serve_speed.keep_unmeasured({"4": {"lilicorr": 5.0}, "startup_s": {}, "card": "H100", "commit": "x"}, doc)
    assert again["measured"] == {"1": "H200, new", "4": "H100, x", "eager": "H200, old", "startup_s": "H200, new"}
    assert again["startup_s"] == {"lilicorr": {"scheduler": 8.0}}


def test_the_startup_steps_medians_join_the_results_file_and_are_kept_by_later_runs(tmp_path):
    startup = {
        "setting": "graphs32",
        "median": {
            "builtin": {"scheduler_e2e": 28.3, "total": 18.2, "ready_s": 92.1},
            "lilicorr": {"scheduler_e2e": 37.2, "total": 20.0, "ready_s": 92.0},
        },
        "over_builtin": {"lilicorr": {"scheduler_e2e": 1.315}},
        "starts": {"builtin": 3, "lilicorr": 3},
    }
    base = {"1": {"lilicorr": 2.0}, "card": "H200", "commit": "a", "measured": {"1": "H200, a"}}
    doc = serve_speed.with_startup_alone(base, startup, "H200, b")
    assert doc["startup_alone_s"]["lilicorr"] == {"graph_capture": 20.0, "scheduler": 37.2, "ready": 92.0, "starts": 3}
    assert doc["measured"] == {"1": "H200, a", "startup_alone_s": "H200, b"} and doc["1"] == {"lilicorr": 2.0}
    later = serve_speed.keep_unmeasured({"4": {"lilicorr": 5.0}, "card": "H100", "commit": "x"}, doc)
    assert later["startup_alone_s"] == doc["startup_alone_s"] and later["measured"]["startup_alone_s"] == "H200, b"
    (tmp_path / "startup.json").write_text(json.dumps(startup))
    with pytest.raises(SystemExit):  # where the starts ran is not optional
        serve_speed.main(
            [
                "--graphs",
                str(tmp_path),
                "--card",
                "x",
                "--commit",
                "y",
                "--out",
                str(tmp_path / "o"),
                "--startup",
                str(tmp_path / "startup.json"),
            ]
        )


def test_a_warm_start_up_is_not_a_start_up_cell(tmp_path):
    """A graphs run whose servers found their Triton caches filled (cold_cache false) measures no start-up: the
    results file keeps the earlier cold one, and says where it was measured."""
    summary = serve_speed.summarize(
        rounds_of({"base": [10, 9], "dflash": [8, 7], "builtin": [6, 5], "lilicorr": [7, 6]}, c=32)
    )
    capture = serve_speed.capture_seconds(LOG)
    for name, cold in (("cold", True), ("warm", False)):
        (tmp_path / name).mkdir()
        doc = {
            "setting": "graphs32",
            "summary": summary,
            "capture_s": {"c=32": {"lilicorr": capture | {"cold_cache": cold}}},
        }
        (tmp_path / name / "speed_summary.json").write_text(json.dumps(doc))
    args = ["--card", "H200", "--commit"]
    assert serve_speed.main(["--graphs", str(tmp_path / "cold"), *args, "old", "--out", str(tmp_path / "o1")]) == 0
    earlier = tmp_path / "o1" / "summary.json"
    assert json.loads(earlier.read_text())["startup_s"] == {"lilicorr": {"graph_capture": 53.67, "scheduler": 77.41}}
    warm = [
        "--graphs",
        str(tmp_path / "warm"),
        *args,
        "new",
        "--keep-from",
        str(earlier),
        "--out",
        str(tmp_path / "o2"),
    ]
    assert serve_speed.main(warm) == 0
    doc = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert doc["startup_s"] == json.loads(earlier.read_text())["startup_s"]
    assert doc["measured"] == {"32": "H200, new", "startup_s": "H200, old"}


def test_late_compiles_counts_sglangs_warning_by_kernel():
    line = "[2026-11-28 21:24:37] Triton kernel '{}' took 1.15 s to compile after serving started. Serving-time ..."
    log = "\n".join([line.format("_fwd_kernel"), "other line", line.format("_fwd_kernel"), line.format("_stage2")])
    assert serve_speed.late_compiles(log) == {"_fwd_kernel": 2, "_stage2": 1}
    assert serve_speed.late_compiles(LOG) == {}
