"""The long-input lineage of the testbed (benchmarks/testbed/long_inputs.py, `python -m benchmarks testbed --long`):
packing conversations, long prompts cut to a token length, the per-draft and per-length summary, and long-pack /
long-serve at toy scale against stand-in servers."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.testbed.run as testbed  # noqa: E402
from stub_server import free_port_block  # noqa: E402
from test_testbed import LAUNCHER  # noqa: E402
from test_train import make_target, write_conversations  # noqa: E402
from benchmarks.testbed import common, long_inputs, long_serve  # noqa: E402

from sglang_lilicorr.reference.check import GreedyReport, Mismatch  # noqa: E402


def conversation(i, system=False):
    messages = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return {"messages": ([{"role": "system", "content": "be brief"}] if system else []) + messages}


def test_pack_joins_conversations_until_long_enough():
    rows = [conversation(i, system=True) for i in range(7)]
    packed = long_inputs.pack(rows, [10] * 7, min_tokens=25, seed=0)
    assert len(packed) == 2  # 3 + 3 conversations; the seventh alone is too short and dropped
    for p in packed:
        roles = [m["role"] for m in p["messages"]]
        assert roles == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
        ]  # one system turn, first
    assert long_inputs.pack(rows, [10] * 7, 25, seed=0) == packed != long_inputs.pack(rows, [10] * 7, 25, seed=1)
    with pytest.raises(ValueError, match="7 conversations but 6 lengths"):
        long_inputs.pack(rows, [10] * 6, 25, 0)


def test_prompts_are_cut_to_their_length():
    render = lambda content: list(range(20 + len(content) // 4))  # noqa: E731 -- 4 characters a token, 20 of template
    sources = [("short", "x" * 100), ("long_a", "y" * 5000), ("long_b", "z" * 9000)]
    rows = long_inputs.long_prompts(render, sources, lengths=[256, 1024], per_length=2)
    assert [(r["prompt"], r["length"]) for r in rows] == [
        ("long_a@256", 256),
        ("long_b@256", 256),
        ("long_a@1024", 1024),
        ("long_b@1024", 1024),
    ]
    assert all(r["length"] - long_inputs.LENGTH_SLACK <= len(r["input_ids"]) <= r["length"] for r in rows)
    with pytest.raises(ValueError, match="only 1 of 2 prompts of 2048 tokens"):
        long_inputs.long_prompts(render, sources, lengths=[2048], per_length=2)


def test_summary_per_draft_and_length():
    def record(draft, length, tokens, blocks, start, end, error=None):
        return {
            "draft": draft,
            "length": length,
            "prompt": f"p{tokens}",
            "completion_tokens": tokens,
            "spec_verify_ct": blocks,
            "start": start,
            "end": end,
            "error": error,
            "input_ids": [1],
            "output_ids": [2] * tokens,
        }

    def check(r):  # the 20-token output: one token past the tolerance (3 ulps) and one near-tie (0.5 ulp)
        ulp = 0.125
        found = (
            [Mismatch(4, 2, 7, 3 * ulp, 2 * ulp, ulp), Mismatch(9, 2, 8, ulp / 2, 2 * ulp, ulp)]
            if r["completion_tokens"] == 20
            else []
        )
        return GreedyReport(r["completion_tokens"], found, 0.0, 0)

    records = [
        record("lilicorr", 1024, 30, 10, 0.0, 1.0),
        record("lilicorr", 1024, 20, 10, 0.5, 2.0),
        record("lilicorr", 4096, 0, 0, 3.0, 4.0, error="HTTPError: 500"),
        record("margin", 1024, 40, 10, 0.0, 1.0),
    ]
    summary, mismatches = long_inputs.summarize(records, check)
    assert summary["lilicorr"]["1024"] == {
        "n": 2,
        "tau": 2.5,
        "tok_s": 25.0,
        "failures": 1,
        "not_greedy": 1,
        "not_argmax_tokens": 2,
        "worst_deficit_ulps": 3.0,
    }
    assert summary["lilicorr"]["4096"] == {
        "n": 1,
        "tau": None,
        "tok_s": 0.0,
        "failures": 1,
        "not_greedy": 0,
        "not_argmax_tokens": 0,
        "worst_deficit_ulps": 0.0,
    }
    assert summary["margin"]["1024"]["tau"] == 4.0
    assert [(m["prompt"], m["position"], m["deficit_ulps"], m["past_tolerance"]) for m in mismatches] == [
        ("p20", 4, 3.0, True),
        ("p20", 9, 0.5, False),
    ]


def test_long_pack_and_long_serve_at_toy_scale(tmp_path, monkeypatch):
    target = make_target(tmp_path / "target")
    first, long = tmp_path / "work0", tmp_path / "long"
    (first / "data").mkdir(parents=True)
    write_conversations(first / "data" / "train.jsonl", 30)
    write_conversations(first / "data" / "heldout.jsonl", 8, seed=1)
    base = ["--work", str(long), "--target", target, "--out", str(tmp_path / "OUT")]
    with pytest.raises(SystemExit, match="pass --long"):
        testbed.main([*base, "long-pack", "--source", str(first)])
    with pytest.raises(SystemExit, match="that is this --work"):
        testbed.main([*base, "--long", "long-pack", "--source", str(long)])
    assert testbed.main([*base, "--long", "long-pack", "--source", str(first), "--min-tokens", "60"]) == 0
    manifest = json.loads((long / "data" / "manifest.json").read_text())
    assert (
        manifest["counts"]["train.jsonl"]["conversations"] == 30
        and 1 <= manifest["counts"]["train.jsonl"]["packed"] < 30
    )
    assert (
        common.scale_and_schedule(testbed.build_parser().parse_args([*base, "--long", "long-pack", "--source", "x"]))[
            "rope_scaling"
        ]
        == "yarn"
    )

    with pytest.raises(SystemExit, match="no draft for"):
        testbed.main([*base, "--long", "long-serve"])
    for variant in ("lilicorr", "margin"):
        (long / "drafts" / variant).mkdir(parents=True)
        (long / "drafts" / variant / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"no draft for \['dflash'\].*copy a draft folder there"):
        testbed.main([*base, "--long", "long-serve"])
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER.format(tests=str(ROOT / "tests")))
    monkeypatch.setattr(long_serve, "LONG_PORT0", free_port_block(3))
    assert (
        testbed.main(
            [
                *base,
                f"--server-launch={sys.executable} {launcher}",
                "--long",
                "long-serve",
                "--variants",
                "lilicorr",
                "margin",
                "base",
                "--lengths",
                "256",
                "512",
                "--per-length",
                "2",
                "--concurrency",
                "2",
            ]
        )
        == 0
    )
    summary = json.loads((long / "long" / "summary.json").read_text())
    assert set(summary["drafts"]) == {"lilicorr", "margin", "base"} and set(summary["drafts"]["margin"]) == {
        "256",
        "512",
    }
    assert "--speculative-algorithm" not in summary["server_args"]["base"]
    assert all((tmp_path / "OUT" / f).is_file() for f in ("not_argmax.jsonl", "records.jsonl", "summary.png"))
    cell = summary["drafts"]["lilicorr"]["512"]
    assert (
        cell["n"] == 2 and cell["tau"] > 1 and cell["failures"] == cell["not_greedy"]
    )  # the stand-in's tokens are not greedy
    assert (
        "--context-length 8192" in summary["server_args"]["lilicorr"] and (tmp_path / "OUT" / "summary.json").is_file()
    )
