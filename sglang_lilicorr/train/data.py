"""Training conversations: jsonl rows {"messages": [...]} -> token ids and a loss mask over the assistant turns, with
the target's chat template. Turn i is supervised on the tokens rendering messages[:i+1] adds to messages[:i] (with the
generation prompt); a last turn the target did not end ("length", "loop") only up to its content. A template that
rewrites earlier turns is refused."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..drafter import eligible_anchors
from ..jsonl import DataError, read_jsonl
from ..ownership import atomic_file

ROLES = ("system", "user", "assistant", "tool")


def checked_messages(row: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataError(
            "'messages' must be a non-empty list of {'role', 'content'} objects",
            where=where,
            fix='give each row `messages`: [{"role": ..., "content": ...}, ...]',
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(
                f"messages[{i}] must be {{'role': one of {ROLES}, 'content': str}}, got {m!r:.120}",
                where=where,
                fix="fix or remove that row",
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render(tokenizer, messages, generation_prompt: bool, chat_kwargs: Mapping[str, Any], open_end=False) -> list[int]:
    """The chat template's ids of `messages`; open_end: up to the last message's content (no end-of-turn)."""
    kwargs = {**chat_kwargs, **({"continue_final_message": True} if open_end else {})}
    return list(
        tokenizer.apply_chat_template(
            list(messages), tokenize=True, return_dict=False, add_generation_prompt=generation_prompt, **kwargs
        )
    )


def open_end(row: Mapping[str, Any]) -> bool:
    """The row's last turn was cut, not ended by the target (regenerate's `turns`: finish_reason length or loop)."""
    last = row["turns"][-1] if isinstance(row.get("turns"), list) and row["turns"] else None
    return isinstance(last, dict) and last.get("finish_reason") in ("length", "loop")


def content_end(tokenizer, messages, chat_kwargs: Mapping[str, Any], ids: list[int]) -> list[int] | None:
    """The ids of `messages` up to the last one's content if they begin `ids`, else None."""
    try:
        upto = render(tokenizer, messages, False, chat_kwargs, open_end=True)
    except ValueError:  # transformers: the final message does not appear verbatim in the rendering
        return None
    return upto if ids[: len(upto)] == upto else None


def tokenize_conversation(
    tokenizer, messages: Sequence[Mapping[str, str]], chat_kwargs: Mapping[str, Any], where: str, cut: bool = False
) -> tuple[list[int], list[bool]]:
    """-> (token ids, loss mask) of a conversation; with `cut`, the last turn up to its content's end."""
    ids = render(tokenizer, messages, False, chat_kwargs)
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(render(tokenizer, messages[:i], True, chat_kwargs)) if i else 0
        upto = render(tokenizer, messages[: i + 1], False, chat_kwargs)
        if cut and i == len(messages) - 1:
            upto = content_end(tokenizer, messages, chat_kwargs, ids) or upto
        if ids[: len(upto)] != upto or start > len(upto):
            raise DataError(
                f"{where}: the chat template does not render this conversation as an extension of its prefix at "
                f"messages[{i}]; the assistant tokens cannot be located. Use a prefix-stable template."
            )
        mask[start : len(upto)] = [True] * (len(upto) - start)
    return ids, mask


@dataclasses.dataclass
class Example:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool


def load_conversations(
    path: str | Path, tokenizer, max_length: int, chat_kwargs: Mapping[str, Any], write_cache: bool = True
) -> list[Example]:
    """Tokenized, truncated examples with at least one block anchor, cached beside the file (`<file>.tokens.pt`,
    keyed by its bytes, tokenizer and options; written only with `write_cache`); large files on a process pool."""
    path = Path(path)
    key = _cache_key(path, tokenizer, max_length, chat_kwargs)
    cache = path.with_name(path.name + ".tokens.pt")
    ours = not cache.exists()  # a file of that name that is not a cache of ours is neither read nor replaced
    if cache.is_file():
        try:
            stored = torch.load(cache, weights_only=True)
        except Exception:  # caches are written whole (atomic_file): a file that does not load is not ours
            stored = None
        ours = isinstance(stored, dict) and isinstance(stored.get("key"), str)
        if ours and stored.get("key") == key:
            lengths = stored["lengths"].tolist()
            return [Example(i.long(), m) for i, m in zip(stored["ids"].split(lengths), stored["mask"].split(lengths))]
    rows = [(f"{path}:{number}", row) for number, row in read_jsonl(path)]
    work = [(where, checked_messages(row, where), open_end(row)) for where, row in rows]
    if len(work) >= POOL_MIN_ROWS and (os.cpu_count() or 1) > 2:
        with concurrent.futures.ProcessPoolExecutor(
            min(32, os.cpu_count()), initializer=_set_worker, initargs=(tokenizer, chat_kwargs)
        ) as pool:
            encoded = list(pool.map(_encode, work, chunksize=256))
    else:
        _set_worker(tokenizer, chat_kwargs)
        encoded = [_encode(w) for w in work]
    examples = []
    for ids, mask in encoded:
        example = Example(
            torch.tensor(ids[:max_length], dtype=torch.long), torch.tensor(mask[:max_length], dtype=torch.bool)
        )
        if eligible_anchors(example.loss_mask[None]).any():
            examples.append(example)
    if not examples:
        raise DataError(
            f"no usable training conversation (each needs an assistant turn of at least 2 tokens within "
            f"max_length={max_length})",
            where=str(path),
            fix="run `lilicorr regenerate` first or check the file",
        )
    if not (write_cache and ours):
        return examples
    lengths = torch.tensor([len(e.input_ids) for e in examples])
    ids, mask = torch.cat([e.input_ids for e in examples]).int(), torch.cat([e.loss_mask for e in examples])
    try:
        with atomic_file(cache) as tmp:
            torch.save({"key": key, "lengths": lengths, "ids": ids, "mask": mask}, tmp)
    except OSError:  # a read-only data folder: no cache, same examples
        pass
    return examples


POOL_MIN_ROWS = 2000  # files this long are tokenized by a process pool
MASK_RULE = "cut-last-turn-open"  # in the cache key: caches of an earlier loss mask are not reused
_WORKER: dict[str, Any] = {}


def _set_worker(tokenizer, chat_kwargs: Mapping[str, Any]) -> None:
    _WORKER.update(tokenizer=tokenizer, chat_kwargs=dict(chat_kwargs))


def _encode(item: tuple[str, list[dict[str, str]], bool]) -> tuple[list[int], list[bool]]:
    where, messages, cut = item
    return tokenize_conversation(_WORKER["tokenizer"], messages, _WORKER["chat_kwargs"], where, cut)


def _cache_key(path: Path, tokenizer, max_length: int, chat_kwargs: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(path.read_bytes() if path.is_file() else b"")
    template, options = getattr(tokenizer, "chat_template", "") or "", json.dumps(dict(chat_kwargs), sort_keys=True)
    for part in (MASK_RULE, getattr(tokenizer, "name_or_path", ""), template, len(tokenizer), max_length, options):
        digest.update(str(part).encode() + b"\0")
    return digest.hexdigest()


LENGTH_MULTIPLE = 64  # batches padded to a multiple of this length: a handful of shapes, not one per batch


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask [b, T] int64, loss_mask [b, T] bool; T rounded up to
    LENGTH_MULTIPLE (few shapes: cuDNN plans each new one)."""
    longest = max(len(e.input_ids) for e in examples)
    t = -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
    ids = torch.full((len(examples), t), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), t), dtype=torch.long)
    loss = torch.zeros((len(examples), t), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n], attn[i, :n], loss[i, :n] = e.input_ids, 1, e.loss_mask
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def epoch_batches(num_examples: int, batch_size: int, seed: int, epoch: int, rank: int, world: int) -> list[list[int]]:
    """This rank's batches of one epoch: a seeded shuffle dealt round-robin, the tail short of all ranks dropped."""
    order = list(range(num_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    per_step = batch_size * world
    steps = max(1, len(order) // per_step)
    order = (order * (per_step // max(len(order), 1) + 1))[: steps * per_step]  # tiny data: repeat to fill
    return [order[s * per_step + rank : (s + 1) * per_step : world] for s in range(steps)]
