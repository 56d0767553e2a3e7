"""The harness end to end against tests/stub_server.py (loopback only)."""

import json
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from stub_server import StubServer, bench_run_argv

from sglang_lilicorr import cli
from sglang_lilicorr.bench import datasets, metrics, runner
from sglang_lilicorr.bench.client import Sampling
from sglang_lilicorr.bench.prompt import Prompt

FIXTURES = Path(__file__).parent / "fixtures" / "speed_bench"
QUALITATIVE = str(FIXTURES / "qualitative.jsonl")
THROUGHPUT = str(FIXTURES / "throughput_1k.jsonl")


def _run(stub, prompts, path, c=1, t=0.0, seed=0, system="spec", api="chat", max_tokens=16, **kw):
    cfg = runner.RunConfig(system, "d", c, t, seed, max_tokens)
    return runner.run(
        prompts,
        cfg,
        stub.url,
        path,
        Sampling(temperature=t, seed=seed, max_tokens=max_tokens),
        api=api,
        show_progress=False,
        **kw,
    )


@pytest.mark.parametrize("api", ["chat", "generate"])
def test_multiturn_prompts_are_played_turn_by_turn_with_replies_appended(tmp_path, api):
    _, prompts = datasets.load_prompts(QUALITATIVE, categories=["roleplay"])
    with StubServer() as stub:
        outcome = _run(stub, prompts, tmp_path / "r.jsonl", api=api)
    assert outcome.done == 1 and not outcome.failures
    assert len(stub.log) == 3
    first, second, third = (e["body"] for e in stub.log)
    if api == "chat":
        assert [m["role"] for m in third["messages"]] == ["user", "assistant", "user", "assistant", "user"]
        assert second["messages"][1] == {"role": "assistant", "content": stub.log[0]["text"]}
        assert third["messages"][3]["content"] == stub.log[1]["text"]
        assert first["return_spec_tokens_details"] is True
    else:
        assert third["text"].split("\n\n")[:4] == [
            prompts[0].turns[0],
            stub.log[0]["text"],
            prompts[0].turns[1],
            stub.log[1]["text"],
        ]
    (record,) = runner.read_results(tmp_path / "r.jsonl")
    assert [t["completion_tokens"] for t in record["turns"]] == [e["completion_tokens"] for e in stub.log]
    assert [t["spec_verify_ct"] for t in record["turns"]] == [e["spec_verify_ct"] for e in stub.log]


def test_tau_matches_the_servers_counters_and_baseline_has_none(tmp_path):
    _, prompts = datasets.load_prompts(QUALITATIVE)
    with StubServer(accept=3) as stub:
        _run(stub, prompts, tmp_path / "r.jsonl", c=2)
    records = runner.read_results(tmp_path / "r.jsonl")
    expected = sum(e["completion_tokens"] for e in stub.log) / sum(e["spec_verify_ct"] for e in stub.log)
    assert metrics.tau(records) == pytest.approx(expected)
    with StubServer(speculative=False) as ar:
        _run(ar, prompts, tmp_path / "ar.jsonl", system="ar")
    assert metrics.tau(runner.read_results(tmp_path / "ar.jsonl")) is None


def test_concurrency_bounds_requests_in_flight(tmp_path):
    prompts = [Prompt(f"p{i}", "c", (f"prompt number {i}",)) for i in range(12)]
    for c in (1, 4):
        with StubServer(min_latency_s=0.05) as stub:
            _run(stub, prompts, tmp_path / f"c{c}.jsonl", c=c)
        assert stub.max_in_flight == c
        assert len(runner.read_results(tmp_path / f"c{c}.jsonl")) == 12


def test_warmup_goes_out_in_unrecorded_waves_of_c_concurrent_requests(tmp_path):
    prompts = [Prompt(f"p{i}", "c", (f"prompt number {i}",)) for i in range(6)]
    with StubServer(min_latency_s=0.05) as stub:
        outcome = _run(stub, prompts, tmp_path / "r.jsonl", c=4, warmup=5)  # max(5, 4) -> 2 waves of 4
    assert outcome.done == 6 and len(stub.log) == 8 + 6
    warm, measured = stub.log[:8], stub.log[8:]
    assert max(e["finished"] for e in warm) <= min(e["arrived"] for e in measured)
    for wave in (warm[:4], warm[4:]):  # the 4 requests of a wave are in flight together
        assert max(e["arrived"] for e in wave) < min(e["finished"] for e in wave)
    assert max(e["finished"] for e in warm[:4]) <= min(e["arrived"] for e in warm[4:])
    assert [len(e["body"]["messages"]) for e in warm] == [1] * 8
    records = runner.read_results(tmp_path / "r.jsonl")
    assert sorted(r["prompt_id"] for r in records) == [p.prompt_id for p in prompts]
    assert min(t["start"] for r in records for t in r["turns"]) >= max(e["finished"] for e in warm) - 0.01


def test_warmup_waves_cover_every_batch_size_up_to_c():
    prompts = [Prompt(f"p{i}", "c", ("x",)) for i in range(3)]
    assert runner.warmup_waves(prompts, 0, 8) == []
    assert [len(w) for w in runner.warmup_waves(prompts, 2, 8)] == [8]  # prompts cycled
    assert [len(w) for w in runner.warmup_waves(prompts, 2, 1)] == [1, 1]
    assert [len(w) for w in runner.warmup_waves(prompts, 9, 4)] == [4, 4, 4]


def test_a_warm_up_request_the_server_answers_with_an_error_ends_nothing(tmp_path):
    """An HTTP error in the warm-up (a prompt too long for the context, ...) is not the run's end: the warm-up records
    nothing, and the measured phase records its own failures, which a rerun retries."""
    with StubServer(fail_first=2) as stub:
        outcome = _run(stub, [Prompt(f"p{i}", "c", ("x",)) for i in range(3)], tmp_path / "r.jsonl", warmup=2)
    assert outcome.done == 3 and not outcome.failures and [e["failed"] for e in stub.log[:2]] == [True, True]


def test_warmup_failure_says_the_server_is_down(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = runner.RunConfig("s", "d", 4, 0.0, 0, 8)
    with pytest.raises(runner.ServerError, match="a warm-up request failed .* start the server"):
        runner.run(
            [Prompt("p0", "c", ("x",))],
            cfg,
            f"http://127.0.0.1:{port}",
            tmp_path / "r.jsonl",
            Sampling(),
            warmup=1,
            show_progress=False,
        )


def test_categories_run_as_separate_phases(tmp_path):
    _, prompts = datasets.load_prompts(THROUGHPUT)
    with StubServer() as stub:
        _run(stub, prompts, tmp_path / "r.jsonl", c=4)
    records = runner.read_results(tmp_path / "r.jsonl")
    spans = {}
    for r in records:
        for t in r["turns"]:
            lo, hi = spans.get(r["category"], (t["start"], t["end"]))
            spans[r["category"]] = (min(lo, t["start"]), max(hi, t["end"]))
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))  # no two tiers overlap


def test_resume_skips_done_prompts_and_retries_failures(tmp_path):
    prompts = [Prompt(f"p{i}", "c", (f"prompt {i}",)) for i in range(6)]
    path = tmp_path / "r.jsonl"
    with StubServer(fail_first=2) as stub:
        first = _run(stub, prompts, path, c=1)
    assert first.done == 4 and len(first.failures) == 2 and "HTTP 500" in first.failures[0][1]
    with open(path, "a") as f:
        f.write('{"system": "spec", "torn')  # a crash mid-write
    with StubServer() as stub:
        second = _run(stub, prompts, path, c=1)
    assert second.skipped == 4 and second.done == 2 and len(stub.log) == 2
    ids = [r["prompt_id"] for r in runner.read_results(path)]
    assert sorted(ids) == sorted(p.prompt_id for p in prompts)
    with StubServer() as stub:  # a different run config shares the file but not the done set
        third = _run(stub, prompts, path, c=2)
    assert third.skipped == 0 and third.done == 6


def test_seed_and_temperature_reach_the_server(tmp_path):
    prompts = [Prompt("p0", "c", ("hello there",))]
    with StubServer() as stub:
        _run(stub, prompts, tmp_path / "r.jsonl", t=1.0, seed=7)
        _run(stub, prompts, tmp_path / "g.jsonl", t=1.0, seed=7, api="generate")
    chat, gen = (e["body"] for e in stub.log)
    assert chat["temperature"] == 1.0 and chat["seed"] == 7
    assert gen["sampling_params"]["temperature"] == 1.0 and gen["sampling_params"]["sampling_seed"] == 7


def test_sweep_runs_greedy_once_and_sampling_per_seed():
    cfgs = runner.sweep_configs("s", ["d"], [1, 2], [0.0, 1.0], [0, 1, 2], 64)
    assert sum(c.temperature == 0 for c in cfgs) == 2 and sum(c.temperature == 1 for c in cfgs) == 6


def bench_report(*argv) -> int:
    return cli.main(["bench", "report", *map(str, argv)])


def test_cli_run_report_compare_end_to_end(tmp_path, capsys):
    common = [
        "--dataset",
        QUALITATIVE,
        THROUGHPUT,
        "--concurrency",
        "1",
        "2",
        "--max-tokens",
        "12",
        "--warmup",
        "1",
        "--no-progress",
    ]
    with StubServer(speculative=False, step_s=0.004) as ar:
        assert (
            cli.main(
                ["bench", "run", "--url", ar.url, "--system", "ar", "--results", str(tmp_path / "ar.jsonl")] + common
            )
            == 0
        )
    with StubServer(accept=4, step_s=0.004) as spec:
        assert (
            cli.main(
                ["bench", "run", "--url", spec.url, "--system", "lilicorr", "--results", str(tmp_path / "spec.jsonl")]
                + common
            )
            == 0
        )
    out = tmp_path / "report"
    assert bench_report(tmp_path / "ar.jsonl", tmp_path / "spec.jsonl", "--baseline", "ar", "--out", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    spec_all = [c for c in summary["cells"] if c["system"] == "lilicorr" and c["group"] == "all"]
    assert len(spec_all) == 4 and all(c["tau"] > 1 and c["speedup"] is not None for c in spec_all)
    report = (out / "report.md").read_text()
    assert "speed_qualitative" in report and "low_entropy" in report and "lilicorr (τ / TPS / Sp.)" in report
    assert "## Per-block wall, concurrency 2" in report and "| lilicorr (ms) |" in report
    assert all(c["block_ms"] > 0 for c in spec_all)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "tps_vs_concurrency_speed_throughput_1k_T0.png" in pngs
    assert "speedup_vs_concurrency_speed_throughput_1k_T0.png" in pngs
    assert "tau_by_category_speed_qualitative_T0_c1.png" in pngs
    assert all((out / p).stat().st_size > 1000 for p in pngs)
    capsys.readouterr()
    assert cli.main(["bench", "compare", str(tmp_path / "ar.jsonl"), str(out / "summary.json")]) == 0
    table = capsys.readouterr().out
    assert "| speed_throughput_1k | mixed | 2 | 0 |" in table and "| ms / block |" in table
    assert bench_report(tmp_path / "spec.jsonl", "--block-ref", "lilicorr", "--out", out, "--no-plots") == 0
    assert "| lilicorr (ms / ratio vs lilicorr) |" in (out / "report.md").read_text()
    capsys.readouterr()
    assert bench_report(tmp_path / "ar.jsonl", tmp_path / "spec.jsonl", "--block-ref", "ar", "--out", out) == 2
    assert capsys.readouterr().err.startswith("error: --block-ref 'ar' is not a speculative system")


def test_cli_reports_failures_with_nonzero_exit(tmp_path, capsys):
    with StubServer(fail_first=1) as stub:
        flags = ["--warmup", "0", "--no-progress", "--max-tokens", "8"]
        code = cli.main(bench_run_argv(THROUGHPUT, tmp_path / "r.jsonl", *flags, url=stub.url, system="s"))
    assert code == 1 and "rerun the same command" in capsys.readouterr().err


def test_cli_says_when_the_server_is_unreachable(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = cli.main(
        bench_run_argv(THROUGHPUT, tmp_path / "r.jsonl", "--no-progress", url=f"http://127.0.0.1:{port}", system="s")
    )
    assert code == 1 and "start the server, or check --url" in capsys.readouterr().err


def test_ids_api_sends_the_prompt_bytes_as_token_ids(tmp_path):
    prompts = [Prompt("p0", "c", ("ab\u00e9",)), Prompt("p1", "c", ("xyz",))]
    with StubServer(accept=3) as stub:
        outcome = _run(stub, prompts, tmp_path / "r.jsonl", api="ids", max_tokens=9)
    assert outcome.done == 2 and not outcome.failures
    bodies = {tuple(e["body"]["input_ids"]) for e in stub.log}
    assert bodies == {(97, 98, 0xC3, 0xA9), (120, 121, 122)} and all("text" not in e["body"] for e in stub.log)
    assert all(e["body"]["sampling_params"]["max_new_tokens"] == 9 for e in stub.log)
    records = runner.read_results(tmp_path / "r.jsonl")
    assert all(t["spec_verify_ct"] == 3 and t["text"] == str(list(range(9))) for r in records for t in r["turns"])


def test_ids_api_refuses_multi_turn_prompts(tmp_path, capsys):
    code = cli.main(bench_run_argv(QUALITATIVE, tmp_path / "r.jsonl", "--api", "ids", system="s"))
    assert code == 2 and "--api ids plays single-turn prompts only" in capsys.readouterr().err


def test_two_prompt_files_of_one_name_are_refused_before_anything_is_written(tmp_path, capsys):
    """A run's records name the dataset by its file's name: two such files would be played as one."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "eval.jsonl").write_text(json.dumps({"id": folder, "text": "hi"}) + "\n")
    argv = bench_run_argv(tmp_path / "a" / "eval.jsonl", tmp_path / "r.jsonl")
    argv[argv.index("--dataset") + 2 : argv.index("--dataset") + 2] = [str(tmp_path / "b" / "eval.jsonl")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "two prompt files named 'eval' (--dataset): rename one" in err
        and not (tmp_path / "r.jsonl").exists()
    )
