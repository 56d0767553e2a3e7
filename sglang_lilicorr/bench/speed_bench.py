"""SPEED-Bench loader (`nvidia/SPEED-Bench`, downloaded by the user): parquet or jsonl; PLACEHOLDER rows refused."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from ..errors import LiLiCorrError
from ..jsonl import loads
from .prompt import Prompt

FIX_RECORD = "fix or remove that record"

PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
SPLITS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k", "throughput_32k")
ENTROPY_TIERS = ("low_entropy", "mixed", "high_entropy")
REQUIRED_FIELDS = ("question_id", "category", "sub_category", "source", "src_id", "difficulty", "multiturn")
REBUILD_HINT = (
    "Rebuild the split with the publisher's preparation script, which downloads each source dataset "
    "(some are gated: log in to the hub and request access first) and fills the turns: "
    "`python prepare.py --config {split} --output_dir DIR` from NVIDIA-NeMo/Skills "
    "(nemo_skills/dataset/speed-bench/prepare.py; NVIDIA Model-Optimizer's examples/specdec_bench "
    "prepares it the same way), then pass DIR/{split}.jsonl here."
)


class SpeedBenchFormatError(LiLiCorrError, ValueError):
    """A SPEED-Bench file does not have the expected schema or still holds placeholder turns."""


def read_records(path: Path) -> List[dict]:
    """Rows of a local parquet or jsonl file, as dicts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"SPEED-Bench file {path} does not exist. Download the split yourself "
            "(e.g. `hf download nvidia/SPEED-Bench --repo-type dataset`) and pass the parquet or jsonl file."
        )
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(
                f"Reading {path} needs pyarrow: `pip install pyarrow`, or convert the split to jsonl."
            ) from e
        try:
            return pq.read_table(path).to_pylist()
        except (ValueError, OSError) as e:  # pyarrow's ArrowInvalid / ArrowIOError
            raise SpeedBenchFormatError(
                f"not a readable parquet file ({e})", where=str(path), fix="pass a SPEED-Bench split file"
            ) from e
    if path.suffix in (".jsonl", ".json"):
        lines = enumerate(path.read_bytes().split(b"\n"), 1)
        return [_row(line, f"{path}:{lineno}") for lineno, line in lines if line.strip()]
    raise SpeedBenchFormatError(
        f"unsupported extension {path.suffix!r}", where=str(path), fix="give a .parquet or .jsonl file"
    )


def _row(line: bytes, where: str) -> dict:
    """One jsonl line as a JSON object."""
    try:
        row = loads(line.decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, too many digits, too deep, a lone surrogate
        raise SpeedBenchFormatError(f"not valid JSON ({e})", where=where, fix=FIX_RECORD) from e
    if not isinstance(row, dict):
        raise SpeedBenchFormatError(
            f"expected a JSON object (one record a line), got {type(row).__name__}", where=where, fix=FIX_RECORD
        )
    return row


def _turns_of(row: dict, where: str) -> List[str]:
    """The user turns of a record, from `turns` (hub schema) or `messages` (prepared jsonl)."""
    if "turns" in row:
        turns = row["turns"]
    elif "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") == "user" for m in messages):
            raise SpeedBenchFormatError(
                "`messages` must be a list of {role: user, content} dicts", where=where, fix=FIX_RECORD
            )
        turns = [m.get("content") for m in messages]
    else:
        raise SpeedBenchFormatError("record has neither `turns` nor `messages`", where=where, fix=FIX_RECORD)
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise SpeedBenchFormatError(
            f"turns must be a non-empty list of non-empty strings, got {turns!r:.80}", where=where, fix=FIX_RECORD
        )
    return turns


def validate(rows: Sequence[dict], split: str, where: str) -> None:
    """Schema check of a split's records; raises SpeedBenchFormatError naming the first problem."""
    if not rows:
        raise SpeedBenchFormatError(f"{where} holds no records.")
    seen, placeholders = set(), []
    for i, row in enumerate(rows):
        at = f"{where} record {i}"
        missing = [k for k in REQUIRED_FIELDS if k not in row]
        if missing:
            raise SpeedBenchFormatError(
                f"missing field(s) {missing}",
                where=at,
                fix=f"expected the SPEED-Bench schema {REQUIRED_FIELDS + ('turns',)}",
            )
        qid = str(row["question_id"])
        if qid in seen:
            raise SpeedBenchFormatError(f"duplicate question_id {qid!r}", where=at, fix=FIX_RECORD)
        seen.add(qid)
        if any(PLACEHOLDER in t for t in _turns_of(row, at)):
            placeholders.append(qid)
        if not isinstance(row["category"], str) or not row["category"]:
            raise SpeedBenchFormatError(
                f"category {row['category']!r:.60} is not a non-empty string", where=at, fix=FIX_RECORD
            )
        if split != "qualitative" and row["category"] not in ENTROPY_TIERS:
            raise SpeedBenchFormatError(
                f"{at}: category {row['category']!r} is not an entropy tier {ENTROPY_TIERS}; "
                f"is {where} really split {split}?"
            )
    if placeholders:
        raise SpeedBenchFormatError(
            f"{where}: {len(placeholders)} of {len(rows)} records still hold placeholder turns "
            f"(e.g. question_id {placeholders[0]!r}). " + REBUILD_HINT.format(split=split)
        )


def load(path: Path, split: Optional[str] = None, categories: Optional[Iterable[str]] = None) -> List[Prompt]:
    """Validated prompts of one SPEED-Bench split file (split: default the file's stem), optionally some categories."""
    path = Path(path)
    split = split or path.stem
    if split not in SPLITS:
        raise SpeedBenchFormatError(
            f"Unknown SPEED-Bench split {split!r} (from {path.name}); name the file after its split or pass "
            f"split= one of {SPLITS}."
        )
    rows = read_records(path)
    validate(rows, split, str(path))
    wanted = set(categories) if categories else None
    if wanted:
        unknown = wanted - {r["category"] for r in rows}
        if unknown:
            raise ValueError(f"{path}: no records in categories {sorted(unknown)}.")
    return [
        Prompt(str(r["question_id"]), str(r["category"]), tuple(_turns_of(r, str(path))), f"speed_bench/{split}")
        for r in rows
        if wanted is None or r["category"] in wanted
    ]
