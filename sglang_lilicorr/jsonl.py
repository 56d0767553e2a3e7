"""JSON-lines files: one JSON object per line, every error naming the file and line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from .errors import LiLiCorrError


class DataError(LiLiCorrError, ValueError):
    """A data file or row is malformed, or a dataset is empty."""


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for every non-blank line; a bad line is a DataError naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file.")
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8.") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:  # JSONDecodeError, and integers too long to convert
                raise DataError(f"{path}:{number}: not valid JSON ({getattr(e, 'msg', e)}); each line must be one JSON object.") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}.")
            yield number, row
