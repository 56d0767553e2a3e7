"""The served-speed step's prompt sets, concurrencies to 64, width use and greedy check, against stand-in servers
(tests/stub_server.py; a LILICORR stand-in reports its verify widths: adaptive 1 and 16, LILICORR_VERIFY_WIDTH=16 only
16): `--prompt-set eval` keeps its rounds apart from the writing set's, graphs64 admits 64 requests with graphs and a
pool for them, a run at c plays at least c prompts, the summary keeps each system's width shares, a call that resumes
a setting warms its servers up again, and `--greedy-check` checks every reply against the fp32 target."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.usefixtures("bench_in_process")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.testbed.run as testbed  # noqa: E402
from stub_server import StubServer  # noqa: E402
from test_testbed import speed_testbed  # noqa: E402
from benchmarks.served import greedy_ulps, paired, serve_speed  # noqa: E402
from benchmarks.testbed import speed  # noqa: E402
from sglang_lilicorr.bench.prompt import Prompt  # noqa: E402

EVAL = [
    {"id": "gsm8k/0", "set": "gsm8k", "text": "how many cats sat on the mat"},
    {"id": "gsm8k/1", "set": "gsm8k", "text": "how many dogs sat on the mat"},
    {"id": "humaneval/0", "set": "humaneval", "text": "def add(a, b): return the sum"},
    {"id": "writingbench/1", "set": "writingbench", "text": "write a story about a cat and a dog"},
    {
        "id": "mtbench/81",
        "set": "mtbench",
        "messages": [{"role": "user", "content": "the dog ran far"}, {"role": "user", "content": "now say it again"}],
    },
]
FIVE = ["base", "dflash", "builtin", "lilicorr", "lilicorr_fixed"]

# a stand-in per server: LILICORR's reports its widths (1 and 16 adaptive, 16 pinned); it logs each request it answers
LAUNCHER = """
import json, os, sys
sys.path.insert(0, {tests!r})
from stub_server import StubServer
args = os.environ["SERVER_ARGS"]
widths = None
if "--speculative-algorithm LILICORR" in args:
    widths = (16,) if os.environ.get("LILICORR_VERIFY_WIDTH") == "16" else (1, 16, 16)
with open(os.environ["LAUNCHES"], "a") as f:
    f.write(json.dumps({{"args": args, "widths": widths}}) + "\\n")
StubServer(speculative="--speculative-algorithm" in args, accept=3, min_latency_s=0.002, widths=widths,
           port=int(os.environ["PORT"])).serve_forever()
"""


def step_args(tmp_path, monkeypatch, target: str | None = None) -> tuple[Path, list[str]]:
    """test_testbed's speed WORK and arguments with this file's stand-ins and evaluation prompts (and `target`)."""
    monkeypatch.setenv("LAUNCHES", str(tmp_path / "launches.jsonl"))
    work, args = speed_testbed(tmp_path, monkeypatch, LAUNCHER)
    (tmp_path / "eval_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in EVAL))
    return work, [f"--target={target}" if target and a.startswith("--target=") else a for a in args]


def rounds_of(folder: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(folder.glob("round*.jsonl")) for line in p.read_text().splitlines()]


def test_graphs64_plays_both_prompt_sets_apart_and_keeps_each_systems_width_use(tmp_path, monkeypatch):
    work, common = step_args(tmp_path, monkeypatch)
    step = ["speed", "--setting=graphs64", "--rounds=1", "--max-tokens=8", "--profile-steps=0", "--systems"]
    assert testbed.main([*common, *step, *FIVE, "--prompt-set=eval", "--concurrency", "1", "6"]) == 0
    folder = work / "speed" / "graphs64_eval"
    launches = [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text().splitlines()]
    assert len(launches) == 5
    for launch in launches:
        args = launch["args"]
        assert "--cuda-graph-max-bs-decode 64" in args and "--max-running-requests 64" in args
        assert "--max-total-tokens 131072" in args
    assert sorted(map(str, (x["widths"] for x in launches))) == ["None", "None", "None", "[1, 16, 16]", "[16]"]
    # the six sets interleaved, one group, MT-Bench's two turns kept
    prompts = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    assert [p["id"] for p in prompts] == ["gsm8k/0", "humaneval/0", "writingbench/1", "mtbench/81", "gsm8k/1"]
    assert {p["set"] for p in prompts} == {"eval"} and len(prompts[3]["messages"]) == 2
    records = rounds_of(folder)
    six = {r["prompt_id"] for r in records if r["concurrency"] == 6 and r["system"] == "base"}
    assert six == {p["id"] for p in prompts} | {"gsm8k/0#2"}  # a run at c plays at least c prompts
    doc = json.loads((folder / "speed_summary.json").read_text())
    assert doc["prompt_set"] == "eval" and doc["folder"] == "graphs64_eval" and doc["graphs_to"] == 64
    assert sorted(doc["summary"], key=int) == ["1", "6"]
    tiers = doc["summary"]["6"]["tiers"]
    assert set(tiers) == {"lilicorr", "lilicorr_fixed"} and tiers["lilicorr_fixed"] == {"16": 1.0}
    assert set(tiers["lilicorr"]) == {"1", "16"} and abs(sum(tiers["lilicorr"].values()) - 1) < 1e-3
    assert (
        "lilicorr_vs_lilicorr_fixed" in doc["summary"]["1"]
        and "LILICORR widths" in (folder / "speed_table.md").read_text()
    )
    assert json.loads((folder / "speed_run.json").read_text())["prompt_set"] == "eval"
    # the writing set of the same setting: its own folder (its own systems), its own summary, none of the eval prompts
    assert testbed.main([*common, *step, *FIVE[:4], "--concurrency", "1"]) == 0
    writing = work / "speed" / "graphs64"
    assert {r["prompt_id"] for r in rounds_of(writing)} == {"writingbench/1", "mtbench/81/1"}
    assert json.loads((writing / "speed_summary.json").read_text())["prompt_set"] == "writing"
    assert len(rounds_of(folder)) == len(records)
    assert speed.setting_folder("graphs64", "--attention-backend flashinfer", "eval") == "graphs64_eval_flashinfer"


def test_both_sets_in_one_call_and_a_call_cut_by_its_deadline_resumes(tmp_path, monkeypatch):
    """--prompt-set writing eval: one start-up, the writing rounds then the eval rounds, each in its own folder; a
    call whose deadline comes after the first round leaves the rest of the writing set and the whole eval set, and the
    same call again finishes both (no run played twice)."""
    import itertools

    work, common = step_args(tmp_path, monkeypatch)
    real = paired.Deadline
    clock = itertools.chain([0.0], itertools.repeat(1000.0))  # round 1 allowed, then past the deadline
    monkeypatch.setattr(paired, "Deadline", lambda at, clock_=None: real(at, lambda: next(clock)))
    monkeypatch.setattr(speed, "enough_time", lambda *_: None)
    monkeypatch.setenv("TESTBED_DEADLINE", "500")
    step = ["speed", "--rounds=2", "--max-tokens=8", "--profile-steps=0", "--concurrency=1", "--systems", *FIVE[:4]]
    assert testbed.main([*common, *step, "--prompt-set", "writing", "eval"]) == 1
    writing, evals = work / "speed" / "graphs32", work / "speed" / "graphs32_eval"
    assert json.loads((writing / "speed_run.json").read_text())["failed"] == [
        "deadline: from c=1 round 2 on not played",
        "deadline: the eval set not played",
    ]
    assert len(rounds_of(writing)) == 4 * 2 and not list(evals.glob("round*.jsonl"))
    assert (writing / "logs").is_dir() and not (evals / "logs").exists()
    monkeypatch.delenv("TESTBED_DEADLINE")
    launches = len((tmp_path / "launches.jsonl").read_text().splitlines())
    assert testbed.main([*common, *step, "--prompt-set", "writing", "eval"]) == 0
    assert len((tmp_path / "launches.jsonl").read_text().splitlines()) == launches + 4  # one start-up for both sets
    for folder, prompts in ((writing, 2), (evals, len(EVAL))):
        summary = json.loads((folder / "speed_summary.json").read_text())
        assert summary["summary"]["1"]["rounds"] == 2 and sorted(summary["capture_s"]) == ["c=1", "c=1 #2"]
        assert len(rounds_of(folder)) == 2 * 4 * prompts
        runs = [line for p in (folder / "runs").glob("*.jsonl") for line in p.read_text().splitlines()]
        assert len(runs) == 2 * 4 * prompts  # nothing recorded twice
    assert (work / "OUT" / "speed_graphs32_eval.tar.gz").is_file()


def test_a_run_at_c_plays_at_least_c_prompts():
    every = [Prompt(f"p{i}", "speed", (f"t{i}",)) for i in range(32)]
    assert [len(speed.run_prompts(every, c)) for c in (1, 4, 8, 16, 32, 64)] == [16, 16, 32, 32, 32, 64]
    sixty_four = speed.run_prompts(every, 64)
    assert [p.prompt_id for p in sixty_four[31:34]] == ["p31", "p0#2", "p1#2"] and sixty_four[32].turns == ("t0",)
    assert len({p.prompt_id for p in sixty_four}) == 64
    assert [p.prompt_id for p in speed.run_prompts(every[:2], 3)] == ["p0", "p1", "p0#2"]


def test_a_sustained_run_plays_four_waves_in_a_folder_of_its_own():
    every = [Prompt(f"p{i}", "speed", (f"t{i}",)) for i in range(32)]
    sustained = [len(speed.run_prompts(every, c, sustained=True)) for c in (1, 4, 8, 32)]
    assert sustained == [16, 16, 32, 128]  # c = 32: the batch stays at 32 for most of the run, not one wave
    assert len({p.prompt_id for p in speed.run_prompts(every, 32, sustained=True)}) == 128
    assert speed.setting_folder("graphs32", "", "eval", sustained=True) == "graphs32_eval_sustained"
    assert speed.setting_folder("graphs32", "", "writing", sustained=True) == "graphs32_sustained"


def test_a_resumed_setting_warms_its_servers_up_before_its_first_round(tmp_path):
    """A call cut by its deadline after round 1, then one that resumes round 2 on servers started afresh: each
    server gets its warm-up (max(warmup, c) unrecorded requests) before that round too, and no run is played twice."""
    prompts = {2: [Prompt(f"p{i}", "speed", (f"tell me {i}",)) for i in range(3)]}
    plan = paired.RoundPlan("speed", 8, rounds=2, warmup=2)
    clock = iter([0.0] + [1000.0] * 10)  # round 1 allowed, then past the deadline
    with StubServer(speculative=False) as a, StubServer() as b:
        urls = {"base": a.url, "lilicorr": b.url}
        failed = paired.play_rounds(urls, prompts, plan, tmp_path, deadline=paired.Deadline(500.0, lambda: next(clock)))
        assert failed == ["deadline: from c=2 round 2 on not played"]
        assert [len(s.log) for s in (a, b)] == [2 + 3, 2 + 3]
        assert paired.play_rounds(urls, prompts, plan, tmp_path) == []
        assert [len(s.log) for s in (a, b)] == [2 * (2 + 3), 2 * (2 + 3)]
        assert paired.play_rounds(urls, prompts, plan, tmp_path) == []  # all played: nothing sent, no warm-up
        assert [len(s.log) for s in (a, b)] == [10, 10]
    assert len(paired.merge_rounds(tmp_path, list(urls), prompts, 2)) == 2


def test_the_speed_summary_keeps_each_systems_width_shares():
    def rec(system, widths=None):
        turn = {"completion_tokens": 20, "start": 0.0, "end": 1.0, "spec_verify_ct": 8 if system != "base" else None}
        if widths is not None:
            turn["spec_cap_lens_histogram"] = widths
        return {"system": system, "concurrency": 8, "turns": [turn]}

    round_ = [rec("base"), rec("dflash"), rec("builtin"), rec("lilicorr", [0, 2, 0, 0, 6]), rec("lilicorr_fixed")]
    entry = serve_speed.summarize([round_, round_])["8"]
    assert entry["tiers"] == {"lilicorr": {"1": 0.25, "4": 0.75}}
    assert "| 1: 0.25, 4: 0.75 |" in serve_speed.table({"8": entry})
    assert "tiers" not in serve_speed.table({"8": {**entry, "tiers": {}}})


def test_greedy_deviation_per_system_checks_each_distinct_reply_once(tmp_path):
    def rec(system, c, *turns):
        return {"system": system, "concurrency": c, "turns": list(turns)}

    same, other = {"input_ids": [1, 2], "output_ids": [3, 4]}, {"input_ids": [1, 2], "output_ids": [3, 5]}
    records = [
        rec("base", 1, same),
        rec("lilicorr", 1, same, other),
        rec("lilicorr", 8, other, {"input_ids": [1], "output_ids": []}),
        rec("dflash", 1, {"completion_tokens": 3}),  # recorded without ids
    ]
    seen = []

    def check(input_ids, output_ids):
        seen.append(output_ids)
        return {"worst_ulps": 2.5 if output_ids[-1] == 5 else 0.5, "beyond_tol": int(output_ids[-1] == 5), "tokens": 2}

    cache = tmp_path / greedy_ulps.CACHE
    assert greedy_ulps.check_new(records, cache, check, allows=lambda: len(seen) < 1) == 1
    assert greedy_ulps.summarize(records, greedy_ulps.read_cache(cache))["1"]["lilicorr"] == {
        "worst_ulps": 0.5,
        "beyond_tol": 0,
        "replies": 2,
        "checked": 1,
        "tokens": 2,
        "tokens_beyond_tol": 0,
    }
    assert greedy_ulps.check_new(records, cache, check) == 1 and seen == [[3, 4], [3, 5]]  # the rest, once each
    summary = greedy_ulps.summarize(records, greedy_ulps.read_cache(cache))
    assert summary["1"] == {
        "base": {"worst_ulps": 0.5, "beyond_tol": 0, "replies": 1, "checked": 1, "tokens": 2, "tokens_beyond_tol": 0},
        "lilicorr": {
            "worst_ulps": 2.5,
            "beyond_tol": 1,
            "replies": 2,
            "checked": 2,
            "tokens": 4,
            "tokens_beyond_tol": 1,
        },
    }
    assert list(summary) == ["1", "8"] and summary["8"]["lilicorr"]["replies"] == 1


def test_greedy_check_records_token_ids_and_checks_them_against_the_fp32_target(tmp_path, monkeypatch):
    from test_train import make_target

    target = make_target(tmp_path / "target")
    work, common = step_args(tmp_path, monkeypatch, target)
    four = ["base", "dflash", "builtin", "lilicorr"]
    step = ["speed", "--rounds=1", "--max-tokens=8", "--profile-steps=0", "--concurrency=1", "--systems", *four]
    assert testbed.main([*common, *step, "--greedy-check"]) == 0
    folder = work / "speed" / "graphs32"
    records = rounds_of(folder)
    assert all(t["input_ids"] and t["output_ids"] for r in records for t in r["turns"])
    greedy = json.loads((folder / "speed_summary.json").read_text())["summary"]["1"]["greedy"]
    assert set(greedy) == set(four)
    assert all(g["checked"] == g["replies"] == 2 and g["worst_ulps"] >= 0 for g in greedy.values())
    # every system's replies are the stub's one reply: checked once, kept for the next call
    assert len(greedy_ulps.read_cache(folder / greedy_ulps.CACHE)) == 1


def test_the_profile_compares_width_1_with_no_speculation_where_width_1_played(tmp_path, monkeypatch):
    from benchmarks.served import step_profile

    profiled = []
    monkeypatch.setattr(step_profile, "record", lambda url, root, steps, prompt: profiled.append(url) or "trace")
    monkeypatch.setattr(step_profile, "summarize", lambda trace, steps: {})
    monkeypatch.setattr(step_profile, "compare", lambda summaries: " - ".join(summaries))
    urls = {s: s for s in ("base", "dflash", "builtin", "lilicorr", "lilicorr_w1")}
    assert speed.profile_systems(urls, tmp_path, 8, "p") == []
    assert profiled == ["lilicorr_w1", "base", "lilicorr", "builtin", "dflash"]
    assert (tmp_path / "profile.md").read_text().startswith("lilicorr_w1 - base")
    profiled.clear()
    speed.profile_systems({s: s for s in ("base", "dflash", "builtin", "lilicorr")}, tmp_path, 8, "p")
    assert profiled == ["lilicorr", "builtin", "dflash", "base"]
