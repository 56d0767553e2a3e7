"""JSON text a user's file may hold (`loads`), and JSON lines read with errors naming the file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from .errors import LiLiCorrError, UsageError


class DataError(LiLiCorrError, ValueError):
    """A data file or row is malformed, or a dataset is empty (exit 1)."""


class MissingFileError(DataError, UsageError):
    """A data file an argument names is not there: the argument cannot work (exit 2)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(text: str | bytes) -> Any:
    """json.loads, with ValueError (as for any bad JSON) also for a value nested deeper than the parser goes and for
    a lone UTF-16 surrogate escape such as "\\ud800" (no character: it cannot be encoded, sent or tokenized)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than the JSON reader goes") from None
    pending = [value]
    while pending:  # every string, keys too, without recursion
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str) and _SURROGATE.search(item):
            lone = _SURROGATE.search(item).group()
            raise ValueError(f"a lone UTF-16 surrogate \\u{ord(lone):04x} in a string: not a character")
    return value


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for every non-blank line; a bad line is a DataError naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"{str(path)!r} is not an existing file",
            where=str(path),
            fix="check the path (a jsonl file, one JSON object a line)",
        )
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"not UTF-8 text ({e.reason} at byte {e.start})",
                    where=f"{path}:{number}",
                    fix="save the file as UTF-8",
                ) from None
            if not line.strip():
                continue
            try:
                row = loads(line)
            except ValueError as e:  # JSONDecodeError, integers too long to convert, too deep, lone surrogates
                raise DataError(
                    f"not valid JSON ({getattr(e, 'msg', e)})",
                    where=f"{path}:{number}",
                    fix="each line must be one JSON object of UTF-8 text",
                ) from None
            if not isinstance(row, dict):
                raise DataError(
                    f"expected a JSON object, got {type(row).__name__}",
                    where=f"{path}:{number}",
                    fix="each line must be one JSON object",
                )
            yield number, row
