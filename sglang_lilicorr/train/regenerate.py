"""`lilicorr regenerate`: prompts -> training conversations whose assistant turn is the target's
own greedy output (the drafter then learns to predict what the verifier will accept).

Input rows: {"id": optional, "messages": [...]} ending in a user turn (trailing assistant turns
are dropped: they are what is regenerated). Output rows: {"id", "messages": prompt + the
target's reply, "finish_reason"}. The output file is appended line by line, so an interrupted
run resumes where it stopped (rows whose id is already there are skipped; a torn last line is
cut off). Prompts that also occur in --exclude (the evaluation prompts) are never written.

Engines: SGLang's offline `sglang.Engine` on a GPU; a transformers greedy loop otherwise.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .data import DataError, checked_messages, read_jsonl

GenerateFn = Callable[[Sequence[Sequence[int]]], list[tuple[str, str]]]  # prompt ids -> (text, finish reason)


def prompt_rows(path: str | Path) -> list[tuple[str, list[dict[str, str]]]]:
    """(id, prompt messages) per row; each prompt must end with a user turn."""
    rows, ids = [], set()
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        messages = checked_messages(row, where)
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages or messages[-1]["role"] != "user":
            raise DataError(f"{where}: a prompt must end with a user turn (after dropping assistant replies).")
        rid = str(row.get("id", f"line-{number}"))
        if rid in ids:
            raise DataError(f"{where}: duplicate id {rid!r}; ids must be unique for resuming.")
        ids.add(rid)
        rows.append((rid, messages))
    if not rows:
        raise DataError(f"{path}: no prompt rows.")
    return rows


def done_ids(path: Path) -> set[str]:
    """Ids already written; a torn last line (interrupted write) is truncated away."""
    if not path.exists():
        return set()
    done, good_end = set(), 0
    with path.open("rb") as f:
        for line in f:
            try:
                done.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                if line.endswith(b"\n"):
                    raise DataError(f"{path}: a complete line is not a regenerated row; move the file aside.") from None
                break
            good_end += len(line)
    if good_end != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_end)
    return done


def message_key(messages: Iterable[Mapping[str, str]]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in messages])


def regenerate(
    prompts: str | Path,
    output: str | Path,
    tokenizer,
    generate: GenerateFn,
    exclude: str | Path | None = None,
    batch_size: int = 64,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Generate the missing rows of ``output``; returns counts (written, skipped, excluded)."""
    chat_kwargs = dict(chat_kwargs or {})
    output = Path(output)
    rows = prompt_rows(prompts)
    banned = {message_key(m) for _, m in prompt_rows(exclude)} if exclude else set()
    done = done_ids(output)
    todo = [(rid, m) for rid, m in rows if rid not in done and message_key(m) not in banned]
    counts = {"written": 0, "skipped": len(rows) - len(todo), "excluded": sum(message_key(m) in banned for _, m in rows)}
    from tqdm.auto import tqdm

    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a", encoding="utf-8") as f, tqdm(total=len(todo), desc="regenerate", dynamic_ncols=True) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            ids = [list(tokenizer.apply_chat_template(m, tokenize=True, return_dict=False, add_generation_prompt=True, **chat_kwargs)) for _, m in chunk]
            for (rid, messages), (text, reason) in zip(chunk, generate(ids)):
                row = {"id": rid, "messages": messages + [{"role": "assistant", "content": text}], "finish_reason": reason}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                counts["written"] += 1
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(chunk))
    return counts


def transformers_generator(model, tokenizer, max_new_tokens: int) -> GenerateFn:
    """Greedy decoding with HF generate, a left-padded batch at a time (the fallback engine)."""
    import torch

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos

    def generate(batch: Sequence[Sequence[int]]) -> list[tuple[str, str]]:
        width = max(len(ids) for ids in batch)
        x = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=model.device)
        with torch.no_grad():
            y = model.generate(x, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad)
        out = []
        for row in y[:, width:].tolist():
            stopped = eos is not None and eos in row
            new = row[: row.index(eos) + 1] if stopped else row
            out.append((tokenizer.decode(new, skip_special_tokens=True), "stop" if stopped else "length"))
        return out

    return generate


def sglang_generator(model_path: str, max_new_tokens: int, **engine_kwargs) -> tuple[GenerateFn, Callable[[], None]]:
    """Greedy decoding through SGLang's offline engine -> (generate, shutdown)."""
    import sglang

    engine = sglang.Engine(model_path=model_path, **engine_kwargs)
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens}

    def generate(batch: Sequence[Sequence[int]]) -> list[tuple[str, str]]:
        results = engine.generate(input_ids=[list(x) for x in batch], sampling_params=params)
        return [(r["text"], str((r.get("meta_info", {}).get("finish_reason") or {}).get("type", ""))) for r in results]

    return generate, engine.shutdown
