"""The lab's `faults` step (`python -m benchmarks faults`) against tests/stub_server.py (loopback only): every kind of
request gets its outcome, the faults are told apart from failures, and a KV pool that does not return to empty fails the
run."""

import json
import random

import pytest

pytest.importorskip("aiohttp")

from stub_server import StubServer

from benchmarks.served import load_faults


def faults(stub, out, *extra) -> int:
    return load_faults.main(
        [
            "--url",
            stub.url,
            "--clients",
            "8",
            "--duration",
            "1.5",
            "--prompt-words",
            "4",
            "64",
            "--max-tokens",
            "16",
            "--drain-timeout",
            "2",
            "--out",
            str(out),
            *map(str, extra),
        ]
    )


def test_load_with_faults_passes_on_a_sound_server(tmp_path, capsys):
    with StubServer(step_s=0.002, context_len=512) as stub:
        assert faults(stub, tmp_path, "--expect-spec") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and summary["violations"] == 0
    assert summary["server"]["health"] == 200 and summary["server"]["kv_empty"]
    assert summary["config"]["context_length"] == 512  # asked from /v1/models
    outcomes = summary["outcomes"]
    assert outcomes["normal"].get("completed", 0) > 0 and set(outcomes["normal"]) == {"completed"}
    assert outcomes["disconnect"].get("disconnected", 0) > 0 and stub.aborted > 0
    assert set(outcomes["too_long"]) == {"rejected"} and set(outcomes["bad_params"]) == {"rejected"}
    requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(requests) == summary["requests"] and {r["client"] for r in requests} == set(range(8))
    assert {r["api"] for r in requests if r["kind"] == "normal"} == {"chat", "generate"}
    assert all(r["stats"] for r in requests if r["kind"] == "normal")
    assert {r["prompt_words"] for r in requests} == {4, 64}
    assert "ok: " in capsys.readouterr().out


def test_missing_spec_stats_are_violations(tmp_path):
    with StubServer(speculative=False, context_len=512) as stub:
        assert faults(stub, tmp_path, "--expect-spec") == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["outcomes"]["normal"].get("failed", 0) > 0 and "no spec stats" in summary["first_violations"][0]


def test_a_kv_pool_that_does_not_return_to_empty_fails(tmp_path):
    with StubServer(context_len=512, leak_on_abort=True) as stub:
        assert faults(stub, tmp_path) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["violations"] == 0 and not summary["server"]["kv_empty"]
    assert summary["server"]["loads"][0]["num_used_tokens"] > 0


def test_server_errors_are_failures_not_rejections(tmp_path):
    with StubServer(context_len=512, fail_first=3) as stub:
        assert faults(stub, tmp_path) == 1
    requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    errors = [r for r in requests if r["status"] == 500]  # the first 3 to arrive, and those in flight with them
    assert len(errors) >= 3 and all(r["outcome"] == "failed" for r in errors)
    assert json.loads((tmp_path / "summary.json").read_text())["violations"] == len(errors)


def test_every_kind_is_planned_with_its_fault():
    config = load_faults.FaultConfig(url="http://127.0.0.1:9", context_length=512, prompt_words=(4,))
    rng = random.Random(0)
    planned = [load_faults.plan(config, 0, i, rng) for i in range(200)]
    kinds = {r.kind for r, _ in planned}
    assert kinds == set(load_faults.KINDS)
    for request, body in planned:
        if request.kind == "disconnect":
            assert body["stream"] is True
        if request.kind == "too_long":
            assert body["max_completion_tokens"] == 512
        if request.kind == "bad_params":
            assert body.get("temperature", 0) < 0 or body.get("top_p", 1) > 1 or body.get("min_p", 0) > 1


def test_prompts_are_cut_to_fit_the_context():
    """A --prompt-words length the context cannot hold (1024 words ~ 4k tokens in a 2k context) is cut,
    so only the too_long requests ask for more than the server holds."""
    from test_train import make_tokenizer

    tok = make_tokenizer()
    config = load_faults.FaultConfig(
        url="http://127.0.0.1:9", context_length=2048, max_tokens=128, prompt_words=(1024,)
    )
    rng = random.Random(0)
    for _ in range(20):
        request, body = load_faults.plan(config, 0, 0, rng)
        assert request.prompt_words == load_faults.fitting_words(config) < 1024
        text = body["messages"][0]["content"] if "messages" in body else body["text"]
        assert len(tok.encode(text)) + load_faults.TEMPLATE_TOKENS + config.max_tokens <= config.context_length
