"""Property tests of every reader of a file the project consumes: training JSONL (train/data.py),
bench results files (runner.read_results), SPEED-Bench rows and prompt files, draft config.json and
model.safetensors headers. Whatever bytes come in, a reader returns a value or raises the project's
own error type (for data.py, its DataError), and never writes the file it reads. Derandomized, so a
run is reproducible; a few hundred examples each."""

import json
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_lilicorr.errors import LiLiCorrError

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(-(2**1100), 2**1100) | st.floats() | st.text(max_size=12)
)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12
)


def json_line(value) -> bytes:
    return json.dumps(value).encode()


def mutated(base: dict, keys: list[str]):
    """`base` with some of `keys` deleted or replaced by any JSON value."""
    edits = st.dictionaries(st.sampled_from(keys), st.none() | st.just("<delete>") | json_values, max_size=4)

    def apply(changes):
        out = json.loads(json.dumps(base))
        for key, value in changes.items():
            where, name = (
                (out.get("dflash_config"), key.split(".", 1)[1]) if key.startswith("dflash_config.") else (out, key)
            )
            if not isinstance(where, dict):  # dflash_config itself was replaced
                continue
            if value == "<delete>":
                where.pop(name, None)
            else:
                where[name] = value
        return out

    return edits.map(apply)


def file_bytes(lines: st.SearchStrategy, tail: st.SearchStrategy = st.binary(max_size=8)) -> st.SearchStrategy:
    """Lines joined by newlines, with or without the last one, sometimes with a torn tail."""
    return st.tuples(st.lists(lines, max_size=5), st.booleans(), tail).map(
        lambda t: b"\n".join(t[0]) + (b"\n" if t[1] else b"") + t[2]
    )


def reads_or_raises(name: str, data: bytes, read, error: type = LiLiCorrError):
    """read(path) of `data` written as the file `name` returns a value (returned here) or raises `error`
    (None here); either way the file is left as it was."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            return read(path)
        except error:
            return None
        finally:
            assert path.read_bytes() == data, "a reader wrote its input"


# --- training JSONL (train/data.py, read-only here) -----------------------------------------------

messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "robot"]),
            "content": st.text(max_size=10) | json_values,
        }
    ),
    max_size=3,
)
training_lines = (
    st.builds(lambda m: json_line({"messages": m}), messages)
    | json_values.map(json_line)
    | st.text(max_size=20).map(str.encode)
)


def read_training(path):
    from sglang_lilicorr.train.data import checked_messages, read_jsonl

    return [checked_messages(row, f"{path}:{n}") for n, row in read_jsonl(path)]


@SETTINGS
@given(file_bytes(training_lines, st.text(max_size=8).map(str.encode)))
def test_training_jsonl_reader(data):
    from sglang_lilicorr.train.data import DataError

    reads_or_raises("train.jsonl", data, read_training, DataError)


@SETTINGS
@given(file_bytes(st.binary(max_size=24)))
def test_training_jsonl_reader_on_any_bytes(data):
    from sglang_lilicorr.train.data import DataError

    reads_or_raises("train.jsonl", data, read_training, DataError)


# --- bench results files ----------------------------------------------------------------------------

RECORD = {
    "system": "s",
    "dataset": "d",
    "concurrency": 2,
    "temperature": 0.0,
    "seed": 0,
    "max_tokens": 8,
    "prompt_id": "p",
    "category": "c",
    "turns": [{"completion_tokens": 8, "spec_verify_ct": 3, "start": 1.0, "end": 2.0, "text": "x"}],
}
result_lines = mutated(RECORD, list(RECORD)).map(json_line) | json_values.map(json_line) | st.binary(max_size=24)


@SETTINGS
@given(file_bytes(result_lines))
def test_results_reader(data):
    from sglang_lilicorr.bench import metrics, runner

    records = reads_or_raises("r.jsonl", data, runner.read_results, metrics.ResultsError) or []
    assert all(isinstance(r, dict) for r in records)
    try:
        metrics.aggregate(records)
    except metrics.ResultsError:
        pass


# --- SPEED-Bench rows and prompt files ----------------------------------------------------------------

SPEED_ROW = {
    "question_id": "q1",
    "category": "coding",
    "sub_category": "x",
    "turns": ["hi"],
    "source": "s",
    "src_id": "1",
    "difficulty": "easy",
    "multiturn": False,
}
PROMPT_ROW = {"id": "a", "set": "s", "text": "hi", "messages": [{"role": "user", "content": "hi"}]}


@SETTINGS
@given(
    file_bytes(
        mutated(SPEED_ROW, list(SPEED_ROW)).map(json_line) | json_values.map(json_line) | st.binary(max_size=24)
    ),
    st.sampled_from(["qualitative.jsonl", "throughput_1k.jsonl"]),
)
def test_speed_bench_reader(data, name):
    from sglang_lilicorr.bench import speed_bench

    reads_or_raises(name, data, speed_bench.load)


@SETTINGS
@given(
    file_bytes(
        mutated(PROMPT_ROW, list(PROMPT_ROW)).map(json_line) | json_values.map(json_line) | st.binary(max_size=24)
    )
)
def test_prompt_file_reader(data):
    from sglang_lilicorr.bench import prompt_file

    reads_or_raises("prompts.jsonl", data, prompt_file.load)


# --- draft config.json and model.safetensors headers ----------------------------------------------------


def draft_config() -> dict:
    from test_serving import draft_config

    return draft_config()


CONFIG_KEYS = (
    [k for k in draft_config() if k != "dflash_config"]
    + ["dflash_config"]
    + [f"dflash_config.{k}" for k in draft_config()["dflash_config"]]
)
configs = mutated(draft_config(), CONFIG_KEYS).map(json_line) | json_values.map(json_line) | st.binary(max_size=40)


@SETTINGS
@given(configs)
def test_draft_config_readers(data):
    from sglang_lilicorr import checkpoint
    from sglang_lilicorr.drafter import DrafterConfig
    from sglang_lilicorr.serving.draft_check import examine_draft

    def read(path):
        report = examine_draft(path.parent)  # collects, never raises
        assert (report.spec is None) == bool(report.problems)
        return checkpoint.read_config(path.parent)

    config = reads_or_raises("config.json", data, read, checkpoint.CheckpointError)
    for parse in (
        checkpoint.has_head,
        checkpoint.lilicorr_config,
        checkpoint.block_size_of,
        checkpoint.dtype_of,
        DrafterConfig.from_hf_config,
    ):
        if config is not None:
            try:
                parse(config)
            except LiLiCorrError:
                pass


def safetensors_file(header: bytes, body: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + body


tensor_headers = st.fixed_dictionaries(
    {},
    optional={
        "w": st.fixed_dictionaries(
            {
                "dtype": st.sampled_from(["F32", "BF16", "I64", "X"]) | json_values,
                "shape": st.lists(st.integers(-1, 4), max_size=3) | json_values,
                "data_offsets": st.lists(st.integers(-1, 64), max_size=3) | json_values,
            }
        ),
        "__metadata__": json_values,
    },
)


@SETTINGS
@given(tensor_headers.map(json_line) | st.binary(max_size=40), st.binary(max_size=64), st.booleans())
def test_draft_weights_reader(header, body, framed):
    from sglang_lilicorr import checkpoint

    data = safetensors_file(header, body) if framed else header + body
    reads_or_raises(
        "model.safetensors", data, lambda path: checkpoint.read_tensors(path.parent), checkpoint.CheckpointError
    )
