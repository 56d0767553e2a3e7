"""The lab's openai-check step (benchmarks/served/openai_check.py), the OpenAI-client check of a LILICORR server,
on the CPU against the stand-in server: an SGLang-shaped server passes; one that lets tokens past max_tokens or a
stop string through fails, by name; without T > 0 (LILICORR without flashinfer) the check says so and keeps to
T = 0; its T = 0 records are what the greedy-check step reads. Each of its checks fires on a reply that breaks it."""

from __future__ import annotations

import json

import pytest

from stub_server import OPENAI_REPLY, StubServer, openai_decode

from benchmarks.served import openai_check  # noqa: E402

openai = pytest.importorskip("openai")


class StubTokenizer:
    """The stand-in server's vocabulary (stub_server.OPENAI_VOCAB) with a chat template of one line."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return f"user: {messages[-1]['content']}\nassistant:"

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [1, 2, 3]}

    def decode(self, ids, skip_special_tokens=True):
        return openai_decode(ids)


def client(stub) -> "openai.OpenAI":
    return openai.OpenAI(base_url=stub.url + "/v1", api_key="none", max_retries=0)


def test_a_server_that_keeps_to_stops_and_max_tokens_passes(capsys):
    with StubServer() as stub:
        records, bad = openai_check.check(client(stub), StubTokenizer())
    assert bad == []
    out = capsys.readouterr().out
    assert "without a temperature is served" in out and "T=0.8 text stream n:" in out
    cases = len(openai_check.CASES) + 1  # n = 2 gives two replies
    assert len(records) == cases * 2 * 2 * len(openai_check.PROMPTS)
    stops = [r for r in records if r["meta"]["matched_stop"] == ". "]
    assert stops and all(r["text"] == "Hello, world" and r["output_ids"] == OPENAI_REPLY[:5] for r in stops)
    assert {r["meta"]["finish_reason"] for r in records} == {"stop", "length"}


def test_tokens_past_a_stop_or_max_tokens_fail_by_name(capsys):
    with StubServer(leak_past_stop=True, refuse_sampled=True) as stub:
        _, bad = openai_check.check(client(stub), StubTokenizer())
    assert any("7 tokens for max_tokens 5" in line for line in bad)
    assert any("complete the stop '. ' before their last token" in line for line in bad)
    kinds = {line.split(":")[0] for line in bad}
    assert {"T=0 chat whole max_tokens", "T=0 text stream stop", "T=0 chat stream logprobs"} <= kinds


def test_without_sampling_it_keeps_to_t0_and_writes_what_the_greedy_check_reads(tmp_path, monkeypatch, capsys):
    import transformers

    from benchmarks.served.greedy_check import served_greedy_records

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: StubTokenizer())
    out = tmp_path / "openai.json"
    with StubServer(refuse_sampled=True) as stub:
        assert openai_check.main(["--url", stub.url, "--tokenizer", "t", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "refused, HTTP 400" in text and "flashinfer" in text and "T=0.8" not in text
    assert "OPENAI_CHECK PASS" in text
    records = served_greedy_records(str(out))
    assert records == json.loads(out.read_text()) and all(r["input_ids"] == [7, 7, 7] for r in records)


def reply(**fields) -> openai_check.Reply:
    base = dict(text="Hello, world.", finish_reason="length", output_ids=OPENAI_REPLY[:4])
    return openai_check.Reply(**{**base, **fields})


@pytest.mark.parametrize(
    "params, fields, completion_tokens, message",
    [
        ({"max_tokens": 4}, {}, 4, None),
        ({"max_tokens": 4}, {"finish_reason": "stop"}, 4, "finish_reason 'stop' with matched_stop None"),
        ({"max_tokens": 4}, {"matched_stop": 0}, 4, "finish_reason 'length' with matched_stop 0"),
        ({"max_tokens": 3}, {}, 4, "4 tokens for max_tokens 3"),
        ({"max_tokens": 8}, {}, 4, "4 tokens for max_tokens 8, finish_reason 'length'"),
        ({"max_tokens": 4}, {"output_ids": None}, 4, "no token ids came back"),
        ({"max_tokens": 4}, {"text": "Hello, world. This"}, 4, "is not its tokens decoded"),
        ({"max_tokens": 4}, {}, 5, "usage.completion_tokens 5, the choices hold 4 tokens"),
        ({"max_tokens": 4}, {}, None, "no usage"),
        ({"max_tokens": 4, "n": 2}, {}, 4, "choices [0], not 0..1"),
        ({"max_tokens": 4, "logprobs": 2}, {"logprobs": [2, 2, 2]}, 4, "logprobs (3, [2]) (entries, alternatives)"),
        ({"max_tokens": 4, "logprobs": 2}, {"logprobs": [2, 2, 3, 2]}, 4, "for 4 tokens, top_logprobs 2"),
        ({"max_tokens": 4, "stop": ["."]}, {}, 4, "the text holds the stop string '.'"),
        (
            {"max_tokens": 9, "stop": [", w"]},
            {"finish_reason": "stop", "matched_stop": ", w", "text": "Hello", "output_ids": [1, 2, 3]},
            3,
            None,
        ),
        (
            {"max_tokens": 9, "stop": [", w"]},
            {"finish_reason": "stop", "matched_stop": ", w", "text": "Hello,", "output_ids": [1, 2, 3]},
            3,
            "is not the tokens up to the stop",
        ),
        (
            {"max_tokens": 9, "stop": ["x"]},
            {"finish_reason": "stop", "matched_stop": ", w", "text": "Hello", "output_ids": [1, 2, 3]},
            3,
            "was not asked for",
        ),
        (
            {"max_tokens": 9},
            {"finish_reason": "stop", "matched_stop": 1, "text": "Hello, world.", "output_ids": [1, 2, 1, 3, 4]},
            5,
            "tokens follow the stop token 1",
        ),
    ],
)
def test_each_check_fires_on_a_reply_that_breaks_it(params, fields, completion_tokens, message):
    response = openai_check.Response({0: reply(**fields)}, completion_tokens, [1])
    found = openai_check.problems(params, response, openai_decode)
    if message is None:
        assert found == []
    else:
        assert any(message in line for line in found), found


def test_a_problem_the_server_without_speculation_has_too_is_sglangs_not_a_failure(tmp_path, monkeypatch, capsys):
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: StubTokenizer())
    base_problems, lilicorr_problems = tmp_path / "base.json", tmp_path / "lilicorr.json"
    argv = lambda stub, *more: ["--url", stub.url, "--tokenizer", "t", "--out", str(tmp_path / "o.json"), *more]  # noqa: E731
    with StubServer(leak_past_stop=True, refuse_sampled=True) as stub:  # the same faults without speculation
        assert openai_check.main(argv(stub, "--problems-out", str(base_problems))) == 1
        assert openai_check.main(argv(stub, "--against", str(base_problems))) == 0
    assert "also without speculation: T=0 chat whole max_tokens" in capsys.readouterr().out
    with StubServer(leak_past_stop=True, refuse_sampled=True) as stub:  # faults the baseline lacks still fail
        empty = tmp_path / "none.json"
        empty.write_text("[]")
        assert openai_check.main(argv(stub, "--against", str(empty), "--problems-out", str(lilicorr_problems))) == 1
    assert json.loads(lilicorr_problems.read_text()) == json.loads(base_problems.read_text())
    own, shared = openai_check.also_without_speculation(
        ["T=0 chat stream logprobs: 'Count': choice 0: logprobs (1, [3]) for 3 tokens", "T=0 text whole stop: x"],
        ["T=0 chat stream logprobs: 'Count': choice 0: logprobs (11, [3]) for 13 tokens"],
    )
    assert own == ["T=0 text whole stop: x"] and len(shared) == 1
