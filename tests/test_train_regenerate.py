"""`lilicorr regenerate`: the target's own answers (and, in the recipe, its own user turns),
resumable, evaluation prompts kept out, every turn's ids recorded."""

import asyncio
import contextlib
import json

import pytest

from sglang_lilicorr.train.data import DataError
from sglang_lilicorr.train.engine import Completion, TransformersGenerator
from sglang_lilicorr.train.prompts import EvalGuard, dedup_and_guard, package_prompts, steering_plan, user_turn_prefix
from sglang_lilicorr.train.regenerate import Settings, build_dataset, play, prompt_plans, request_seed


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


class FakeEngine:
    """User turns (T = 1) are one of a few 'questions' picked by the seed (so some repeat); replies
    say how long their prompt was. Every completion ends with the end-of-turn id unless its seed
    is in `cut_off`. `calls` records each request's temperature."""

    QUESTIONS = ["the cat sat on a mat", "one dog ran far", "two three four five", "six seven dog", "the cat ran"]
    capacity = 4

    def __init__(self, tokenizer, cut_off=()):
        self.tok, self.calls, self.cut_off = tokenizer, [], set(cut_off)

    @contextlib.asynccontextmanager
    async def session(self):
        async def complete(prompt, sampling, seed):
            self.calls.append(sampling.temperature)
            await asyncio.sleep(0)  # conversations interleave, as with servers
            if sampling.temperature > 0:
                text = self.QUESTIONS[seed % len(self.QUESTIONS)]
            else:
                text = " ".join(["one"] * (len(prompt) % 5 + 1))
            ids = self.tok.encode(text, add_special_tokens=False)
            stop = [] if seed in self.cut_off else [self.tok.eos_token_id]
            return Completion(ids + stop, "stop" if stop else "length")

        yield complete


def rows_of(path):
    return [json.loads(line) for line in open(path)]


def test_play_records_messages_and_exact_turn_ids(tmp_path, tokenizer):
    plans = prompt_plans(write_prompts(tmp_path / "p.jsonl", ["the cat", "a dog"]))
    out = tmp_path / "out.jsonl"
    play(plans, out, tokenizer, FakeEngine(tokenizer), Settings())
    rows = rows_of(out)
    assert sorted(r["id"] for r in rows) == ["p0", "p1"]
    for r in rows:
        (turn,) = r["turns"]
        assert turn["prompt_ids"] == tokenizer.apply_chat_template(
            r["messages"][:1], tokenize=True, return_dict=False, add_generation_prompt=True
        )
        assert turn["output_ids"][-1] == tokenizer.eos_token_id and turn["finish_reason"] == "stop"
        assert r["messages"][1] == {
            "role": "assistant",
            "content": tokenizer.decode(turn["output_ids"], skip_special_tokens=True),
        }


def test_multi_turn_prompts_are_played_turn_by_turn(tmp_path, tokenizer):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "m", "set": "mtbench", "turns": ["the cat", "now the dog"]}) + "\n")
    play(prompt_plans(path), tmp_path / "o.jsonl", tokenizer, FakeEngine(tokenizer), Settings())
    (row,) = rows_of(tmp_path / "o.jsonl")
    assert row["set"] == "mtbench" and [m["role"] for m in row["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    second = row["turns"][1]["prompt_ids"]
    assert second == tokenizer.apply_chat_template(
        row["messages"][:3], tokenize=True, return_dict=False, add_generation_prompt=True
    )


def test_resume_skips_done_and_cuts_a_torn_line(tmp_path, tokenizer):
    plans = prompt_plans(write_prompts(tmp_path / "p.jsonl", ["a", "b", "c", "d"]))
    out = tmp_path / "train.jsonl"
    out.write_text(
        json.dumps({"id": "p0", "messages": [], "turns": []}) + "\n" + '{"id": "p1", "mess'
    )  # interrupted write
    engine = FakeEngine(tokenizer)
    play(plans, out, tokenizer, engine, Settings())
    assert engine.calls == [0.0, 0.0, 0.0]  # p1..p3 answered
    assert sorted(r["id"] for r in rows_of(out)) == ["p0", "p1", "p2", "p3"]
    play(plans, out, tokenizer, engine, Settings())
    assert len(engine.calls) == 3  # all done: nothing generated


def test_past_until_no_conversation_starts_and_a_later_call_plays_them(tmp_path, tokenizer):
    import time

    plans = prompt_plans(write_prompts(tmp_path / "p.jsonl", ["a", "b", "c"]))
    out, engine = tmp_path / "o.jsonl", FakeEngine(tokenizer)
    stats = play(plans, out, tokenizer, engine, Settings(), until=time.time() - 1)
    assert stats.unplayed == 3 and engine.calls == [] and not out.read_text()
    assert not (tmp_path / "o.jsonl.dropped").read_text()  # not dropped: a later call plays them
    stats = play(plans, out, tokenizer, engine, Settings(), until=time.time() + 60)
    assert stats.unplayed == 0 and sorted(r["id"] for r in rows_of(out)) == ["p0", "p1", "p2"]


def test_prompt_files_that_overlap_the_evaluation_are_refused_by_line(tmp_path):
    evaluation = write_prompts(tmp_path / "eval.jsonl", ["Write a story about a cat who learns to fly over the sea"])
    guard = EvalGuard.of([json.loads(line)["messages"][0]["content"] for line in open(evaluation)])
    prompts = write_prompts(
        tmp_path / "p.jsonl", ["keep me", "please write a story about a cat who learns to fly over the sea today"]
    )
    with pytest.raises(
        DataError, match=r"this prompt equals an evaluation prompt or shares an 8-word shingle.*p.jsonl:2"
    ):
        prompt_plans(prompts, guard)


def test_malformed_prompts_are_named(tmp_path):
    with pytest.raises(DataError, match="not valid JSON.*p.jsonl:2"):
        prompt_plans(write_prompts(tmp_path / "p.jsonl", ["a"], ["{oops"]))
    with pytest.raises(DataError, match="no user turn"):
        prompt_plans(write_prompts(tmp_path / "p.jsonl", [], ['{"messages": [{"role": "system", "content": "x"}]}']))
    with pytest.raises(DataError, match="duplicate id"):
        prompt_plans(
            write_prompts(tmp_path / "p.jsonl", [], ['{"id": 1, "messages": [{"role": "user", "content": "x"}]}'] * 2)
        )
    with pytest.raises(DataError, match="no prompt rows"):
        prompt_plans(write_prompts(tmp_path / "p.jsonl", []))
    with pytest.raises(DataError, match="is not an existing file"):
        prompt_plans(tmp_path / "missing.jsonl")


def test_recipe_builds_deduplicated_disjoint_data_with_a_manifest(tmp_path, tokenizer):
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(json.dumps({"id": "e", "set": "x", "text": "six seven dog"}) + "\n")
    engine = FakeEngine(tokenizer, cut_off={request_seed(0, "magpie-3", 0, "user")})
    out = tmp_path / "data"
    manifest = build_dataset(
        out, tokenizer, engine, Settings(), magpie=30, package=6, second_turn_share=0.5, heldout=3, exclude=evaluation
    )
    rows = rows_of(out / "conversations.jsonl")
    users = [m["content"] for r in rows for m in r["messages"] if m["role"] == "user"]
    assert "six seven dog" not in users  # the evaluation prompt (as a self-written turn) was dropped
    magpie_users = [r["messages"][0]["content"] for r in rows if r["source"] == "magpie"]
    assert len(magpie_users) == len(set(magpie_users)) <= len(FakeEngine.QUESTIONS)  # deduplicated
    assert {r["source"] for r in rows} == {"magpie", "package"} and any(len(r["turns"]) == 2 for r in rows)
    dropped = rows_of(out / "conversations.jsonl.dropped")
    assert {"user_turn_duplicate", "user_turn_overlaps_eval", "user_turn_cut_off"} <= {d["reason"] for d in dropped}
    assert len(rows) + len(dropped) == manifest["prepared"]["package_prompts"]["kept"] + 30
    train, held = rows_of(out / "train.jsonl"), rows_of(out / "heldout.jsonl")
    assert len(held) == 3 and not {r["id"] for r in train} & {r["id"] for r in held}
    counts = manifest["counts"]
    assert counts["conversations"] == len(rows) and counts["reply_tokens"] == sum(
        len(t["output_ids"]) for r in rows for t in r["turns"]
    )
    assert (
        manifest["files"]["train.jsonl"]["rows"] == len(train) and len(manifest["files"]["train.jsonl"]["sha256"]) == 64
    )
    # a second call resumes: nothing is generated again, the same data comes out
    before = (out / "train.jsonl").read_bytes()
    again = FakeEngine(tokenizer)
    build_dataset(
        out, tokenizer, again, Settings(), magpie=30, package=6, second_turn_share=0.5, heldout=3, exclude=evaluation
    )
    assert again.calls == [] and (out / "train.jsonl").read_bytes() == before


def test_prompt_sources():
    texts = package_prompts(30, seed=0)
    assert len(texts) == 30 and sum("```python" in t or "Write a Python function" in t for t in texts) >= 15
    plan = steering_plan(100, seed=0)
    assert len(plan) == 100 and plan.count(None) == 40
    kept, why = dedup_and_guard(["a b", "The cat sat!", "the  cat sat", "x y z w"], EvalGuard.of(["x y z w"]), set())
    assert kept == ["The cat sat!"] and why == {"short": 1, "duplicate": 1, "overlaps_eval": 1}


def test_user_turn_prefix_renders_history_and_system(tokenizer):
    assert user_turn_prefix(tokenizer) == "[user]"
    assert (
        user_turn_prefix(tokenizer, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "S")
        == "[system]S<|eos|>[user]a<|eos|>[assistant]b<|eos|>[user]"
    )


def test_transformers_engine_writes_the_targets_greedy_reply(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from test_train import make_target

    target = make_target(tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    play(
        prompt_plans(write_prompts(tmp_path / "p.jsonl", ["the cat"])),
        tmp_path / "t.jsonl",
        tok,
        TransformersGenerator(model, tok.pad_token_id),
        Settings(max_new_tokens=5),
    )
    (row,) = rows_of(tmp_path / "t.jsonl")
    ids = row["turns"][0]["prompt_ids"]
    greedy = model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=5,
        pad_token_id=tok.pad_token_id,
        eos_token_id=[tok.eos_token_id],
    )
    want = greedy[0, len(ids) :].tolist()
    if tok.eos_token_id in want:
        want = want[: want.index(tok.eos_token_id) + 1]
    assert row["turns"][0]["output_ids"] == want
