"""Paired, alternating rounds (benchmarks/served/paired.py) against stand-in servers: the rotation, the runs each
round plays, whole cells only in the merged round files, and the deadline that stops before a round."""

import json

import pytest

pytest.importorskip("aiohttp")

from stub_server import StubServer

from sglang_lilicorr import cli
from sglang_lilicorr.bench import runner

from benchmarks.served import paired
from sglang_lilicorr.bench.prompt import Prompt

PROMPTS = {
    1: [Prompt(f"p{i}", "all", (f"prompt {i}",)) for i in range(2)],
    2: [Prompt(f"p{i}", "all", (f"prompt {i}",)) for i in range(4)],
}


def test_rotation_moves_every_system_through_every_place():
    orders = [paired.rotation(["a", "b", "c"], r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted(o[i] for o in orders) == ["a", "b", "c"] for i in range(3))


def test_rounds_alternate_the_servers_and_merge_into_paired_runs(tmp_path):
    with StubServer(accept=2, min_latency_s=0.002) as a, StubServer(accept=4, min_latency_s=0.002) as b:
        urls = {"a": a.url, "b": b.url}
        plan = paired.RoundPlan("toy", max_tokens=8, rounds=2, api="ids", ignore_eos=True, warmup=1)
        assert paired.play_rounds(urls, PROMPTS, plan, tmp_path, log=lambda line: None) == []
    measured = [e for e in a.log + b.log if e["completion_tokens"] == 8]
    assert len(measured) == len(a.log) + len(b.log) and all(
        e["body"]["sampling_params"]["ignore_eos"] for e in measured
    )
    assert len(a.log) == (1 + 2 * 2) + (
        2 + 4 * 2
    )  # c=1: a warm-up wave of 1, 2 prompts x 2 rounds; c=2: a wave of 2, 4 x 2
    files = paired.merge_rounds(tmp_path, ["a", "b"], PROMPTS, 2)
    assert [f.name for f in files] == ["round1.jsonl", "round2.jsonl"]
    rows = runner.read_results(files[0])
    assert {(r["system"], r["concurrency"]) for r in rows} == {(s, c) for s in "ab" for c in (1, 2)} and len(rows) == 12
    out = tmp_path / "report"
    assert cli.main(["bench", "report", *map(str, files), "--block-ref", "a", "--out", str(out), "--no-plots"]) == 0
    cells = json.loads((out / "summary.json").read_text())["cells"]
    b1 = next(c for c in cells if c["system"] == "b" and c["concurrency"] == 1)
    assert b1["paired"]["tps"]["n"] == 2 and b1["tau"] == pytest.approx(4.0)


def test_a_cell_some_system_did_not_finish_is_left_out_whole(tmp_path):
    with StubServer(min_latency_s=0.002) as a, StubServer(min_latency_s=0.002) as b:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=1, warmup=0)
        paired.play_rounds({"a": a.url, "b": b.url}, PROMPTS, plan, tmp_path, log=lambda line: None)
    cut = paired.run_path(tmp_path, 2, 1, "b")
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[:3]))  # b stopped after 3 of 4 prompts at c=2
    (round1,) = paired.merge_rounds(tmp_path, ["a", "b"], PROMPTS, 1)
    assert {r["concurrency"] for r in runner.read_results(round1)} == {1}
    cut.write_text("")
    paired.run_path(tmp_path, 1, 1, "a").unlink()
    assert paired.merge_rounds(tmp_path, ["a", "b"], PROMPTS, 1) == [] and not round1.exists()


def test_the_deadline_stops_before_a_round_it_leaves_no_time_for(tmp_path):
    now = [0.0]
    deadline = paired.Deadline(100.0, clock=lambda: now[0])
    assert deadline.left() == 100.0 and paired.Deadline(None).allows(1e9)
    lines = []
    with StubServer(min_latency_s=0.002) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=3, warmup=0, reserve_s=30.0)
        now[0] = 60.0  # 40 s left, 30 kept in reserve: the first round (no estimate yet) still fits
        failures = paired.play_rounds(
            {"a": a.url}, {1: PROMPTS[1]}, plan, tmp_path, deadline=deadline, log=lines.append
        )
        assert failures == [] and len(a.log) == 6
        now[0] = 75.0  # 25 s left: not even the reserve
        failures = paired.play_rounds(
            {"a": a.url}, {1: PROMPTS[1], 2: PROMPTS[2]}, plan, tmp_path, deadline=deadline, log=lines.append
        )
    assert failures == ["deadline: from c=1 round 1 on not played"] and len(a.log) == 6
    assert "stopping before c=1 round 1: 25 s left" in lines[-1]


def test_a_server_that_is_gone_is_recorded_and_the_others_go_on(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with StubServer(min_latency_s=0.002) as a:
        failures = paired.play_rounds(
            {"a": a.url, "gone": dead},
            {1: PROMPTS[1]},
            paired.RoundPlan("toy", 4, rounds=1),
            tmp_path,
            log=lambda line: None,
        )
    assert len(failures) == 1 and failures[0].startswith("gone c=1 round 1: ServerError") and len(a.log) == 2 + 2


def test_rotation_of_rounds_past_the_systems_and_the_deadline_boundary():
    assert paired.rotation(["a", "b"], 5) == ["b", "a"] and paired.rotation(["a", "b", "c", "d"], 6) == [
        "c",
        "d",
        "a",
        "b",
    ]
    assert paired.rotation(["a"], 3) == ["a"]
    deadline = paired.Deadline(50.0, clock=lambda: 20.0)
    assert deadline.left() == 30.0 and deadline.allows(30.0) and not deadline.allows(30.5)
    assert paired.Deadline(None).left() == float("inf")


def test_round_plan_defaults():
    plan = paired.RoundPlan("toy", 8)
    assert (plan.rounds, plan.api, plan.ignore_eos, plan.warmup, plan.request_timeout, plan.reserve_s) == (
        3,
        "chat",
        False,
        2,
        300.0,
        0.0,
    )
    assert paired.run_path("w", 4, 2, "s").as_posix() == "w/runs/c4_r2_s.jsonl"


def test_the_first_round_needs_only_the_reserve(tmp_path):
    """Before any round has been timed the deadline must leave plan.reserve_s, no more: exactly that plays."""
    now = [0.0]
    with StubServer(min_latency_s=0.002) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=1, warmup=0, reserve_s=30.0)
        assert (
            paired.play_rounds(
                {"a": a.url},
                {1: PROMPTS[1]},
                plan,
                tmp_path,
                deadline=paired.Deadline(30.0, clock=lambda: now[0]),
                log=lambda line: None,
            )
            == []
        )
        assert len(a.log) == 2
        failures = paired.play_rounds(
            {"a": a.url},
            {1: PROMPTS[1]},
            plan,
            tmp_path / "late",
            deadline=paired.Deadline(29.5, clock=lambda: now[0]),
            log=lambda line: None,
        )
    assert failures == ["deadline: from c=1 round 1 on not played"] and len(a.log) == 2


def test_a_round_plan_is_frozen():
    import dataclasses

    plan = paired.RoundPlan("toy", 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rounds = 5
    assert plan == paired.RoundPlan("toy", 8) and hash(plan) == hash(paired.RoundPlan("toy", 8))


def test_rounds_are_recorded_greedy_at_seed_0_and_an_empty_work_merges_to_nothing(tmp_path):
    assert paired.merge_rounds(tmp_path, ["a"], PROMPTS, 2) == []  # nothing played: no file, no error
    with StubServer(min_latency_s=0.002) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=1, warmup=0)
        assert paired.play_rounds({"a": a.url}, {1: PROMPTS[1]}, plan, tmp_path, log=lambda line: None) == []
    rows = runner.read_results(paired.run_path(tmp_path, 1, 1, "a"))
    assert {
        (r["system"], r["dataset"], r["concurrency"], r["temperature"], r["seed"], r["max_tokens"]) for r in rows
    } == {("a", "toy", 1, 0.0, 0, 4)}
    (round1,) = paired.merge_rounds(tmp_path, ["a"], PROMPTS, 2)  # c=2 and round 2 never played: left out
    assert round1.name == "round1.jsonl" and runner.read_results(round1) == rows


def test_prompts_that_fail_in_a_run_are_reported_with_the_first(tmp_path):
    with StubServer(min_latency_s=0.002, fail_first=1) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=1, warmup=0)
        failures = paired.play_rounds({"a": a.url}, {1: PROMPTS[1]}, plan, tmp_path, log=lambda line: None)
    assert len(failures) == 1 and failures[0].startswith("a c=1 round 1: 1 prompt(s) failed, first p0: ")
    assert paired.merge_rounds(tmp_path, ["a"], {1: PROMPTS[1]}, 1) == []  # the cell is not whole


def test_rounds_report_only_through_log(tmp_path, capsys):
    """play_rounds speaks through `log` alone (the runs' progress bars are off): one line per round."""
    lines = []
    with StubServer(min_latency_s=0.002) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=2, warmup=0)
        assert paired.play_rounds({"a": a.url}, {1: PROMPTS[1]}, plan, tmp_path, log=lines.append) == []
    out, err = capsys.readouterr()
    assert (out, err) == ("", "")
    assert [line.split(" done in ")[0] for line in lines] == ["[rounds] c=1 round 1", "[rounds] c=1 round 2"]


# --- what mutation testing found untested: watch, the runs' options, the first failure, the log, merge's edges ------


def test_watch_is_called_around_each_run_and_the_runs_get_the_plans_timeout(tmp_path, monkeypatch):
    calls = []

    def run(todo, config, url, path, sampling, **kw):
        calls.append(("run", config.system, config.concurrency, kw["warmup"], kw["request_timeout"]))
        return runner.RunOutcome(failures=[("p0", "boom"), ("p1", "bang")])

    def watch(system, c, r):
        calls.append(("watch", system, c, r))
        return lambda: calls.append(("done", system))

    monkeypatch.setattr(runner, "run", run)
    clock = iter([100.0])  # the round's start, then 2.5 s later
    monkeypatch.setattr(paired.time, "time", lambda: next(clock, 102.5))
    lines = []
    plan = paired.RoundPlan("toy", max_tokens=4, rounds=1, warmup=3, request_timeout=12.5)
    failures = paired.play_rounds({"a": "u"}, {2: PROMPTS[2]}, plan, tmp_path, log=lines.append, watch=watch)
    assert calls == [("watch", "a", 2, 1), ("run", "a", 2, 3, 12.5), ("done", "a")]
    assert failures == ["a c=2 round 1: 2 prompt(s) failed, first p0: boom"]
    assert lines == ["[rounds] c=2 round 1 done in 2.5 s"]


def test_merge_writes_each_whole_round_and_touches_no_other_round_file(tmp_path):
    with StubServer(min_latency_s=0.002) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=2, warmup=0)
        assert paired.play_rounds({"a": a.url}, {1: PROMPTS[1]}, plan, tmp_path, log=lambda line: None) == []
    paired.run_path(tmp_path, 1, 1, "a").unlink()  # round 1 not whole: no file; round 2 still merged
    for stray in ("round0.jsonl", "round3.jsonl"):
        (tmp_path / stray).write_text("not ours\n")
    assert paired.merge_rounds(tmp_path, ["a"], {1: PROMPTS[1]}, 2) == [tmp_path / "round2.jsonl"]
    assert (tmp_path / "round0.jsonl").read_text() == (tmp_path / "round3.jsonl").read_text() == "not ours\n"


def test_merge_keeps_utf8_text_whatever_the_locale(tmp_path):
    from ascii_locale import run_in_ascii_locale

    with StubServer(min_latency_s=0.002) as a:
        plan = paired.RoundPlan("toy", max_tokens=4, rounds=1, warmup=0)
        assert paired.play_rounds({"a": a.url}, {1: PROMPTS[1]}, plan, tmp_path, log=lambda line: None) == []
    path = paired.run_path(tmp_path, 1, 1, "a")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    path.write_text(
        "".join(json.dumps({**r, "note": "réponse"}, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    (merged,) = paired.merge_rounds(tmp_path, ["a"], {1: PROMPTS[1]}, 1)
    assert merged.read_text(encoding="utf-8") == path.read_text(encoding="utf-8")
    merged.unlink()
    code = (
        "import sys; from pathlib import Path; from benchmarks.served import paired; "
        "from sglang_lilicorr.bench.prompt import Prompt; "
        "paired.merge_rounds(Path(sys.argv[1]), ['a'], {1: [Prompt(f'p{i}', 'all', ('x',)) for i in range(2)]}, 1)"
    )
    out = run_in_ascii_locale(code, str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "round1.jsonl").read_text(encoding="utf-8") == path.read_text(encoding="utf-8")
