"""`lilicorr regenerate`: the target's own greedy answers, resumable, evaluation prompts excluded."""
import json

import pytest

from sglang_lilicorr.train.data import DataError
from sglang_lilicorr.train.regenerate import prompt_rows, regenerate, transformers_generator



def write_prompts(path, texts, extra=None):
    with open(path, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": t}]}) + "\n")
        for line in extra or []:
            f.write(line + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    from test_train import make_tokenizer

    return make_tokenizer()


def echo_generate(calls):
    def generate(batch):
        calls.append(len(batch))
        return [(f"reply {len(ids)}", "stop") for ids in batch]
    return generate


def test_resume_skips_done_and_cuts_a_torn_line(tmp_path, tokenizer):
    prompts = write_prompts(tmp_path / "p.jsonl", ["a", "b", "c", "d"])
    out = tmp_path / "train.jsonl"
    out.write_text(json.dumps({"id": "p0", "messages": []}) + "\n" + '{"id": "p1", "mess')  # interrupted write
    calls = []
    counts = regenerate(prompts, out, tokenizer, echo_generate(calls), batch_size=2)
    assert counts == {"written": 3, "skipped": 1, "excluded": 0} and calls == [2, 1]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2", "p3"]
    assert rows[1]["messages"][-1]["role"] == "assistant" and rows[1]["messages"][0]["content"] == "b"
    assert regenerate(prompts, out, tokenizer, echo_generate(calls))["written"] == 0  # all done


def test_evaluation_prompts_never_become_training_data(tmp_path, tokenizer):
    prompts = write_prompts(tmp_path / "p.jsonl", ["keep", "held out", "keep too"])
    held = write_prompts(tmp_path / "eval.jsonl", ["held out"])
    counts = regenerate(prompts, tmp_path / "t.jsonl", tokenizer, echo_generate([]), exclude=held)
    assert counts["excluded"] == 1 and counts["written"] == 2
    assert "held out" not in (tmp_path / "t.jsonl").read_text()


def test_malformed_prompts_are_named(tmp_path):
    with pytest.raises(DataError, match="p.jsonl:2: not valid JSON"):
        prompt_rows(write_prompts(tmp_path / "p.jsonl", ["a"], ["{oops"]))
    with pytest.raises(DataError, match="must end with a user turn"):
        prompt_rows(write_prompts(tmp_path / "p.jsonl", [], ['{"messages": [{"role": "system", "content": "x"}]}']))
    with pytest.raises(DataError, match="duplicate id"):
        prompt_rows(write_prompts(tmp_path / "p.jsonl", [], ['{"id": 1, "messages": [{"role": "user", "content": "x"}]}'] * 2))
    with pytest.raises(DataError, match="no prompt rows"):
        prompt_rows(write_prompts(tmp_path / "p.jsonl", []))
    with pytest.raises(DataError, match="no such file"):
        prompt_rows(tmp_path / "missing.jsonl")


def test_transformers_fallback_writes_the_targets_greedy_reply(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from test_train import make_target

    target = make_target(tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    prompts = write_prompts(tmp_path / "p.jsonl", ["the cat"])
    regenerate(prompts, tmp_path / "t.jsonl", tok, transformers_generator(model, tok, 5))
    row = json.loads((tmp_path / "t.jsonl").read_text())
    ids = tok.apply_chat_template(row["messages"][:1], tokenize=True, return_dict=False, add_generation_prompt=True)
    greedy = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=5, pad_token_id=tok.pad_token_id)
    assert row["messages"][-1]["content"] == tok.decode(greedy[0, len(ids):], skip_special_tokens=True)
    assert row["finish_reason"] in ("stop", "length")
