"""Training conversations: jsonl rows {"messages": [{"role", "content"}, ...]} -> token ids and a
loss mask over the assistant turns, rendered with the target's chat template.

An assistant turn i is supervised on the tokens that rendering messages[:i+1] adds to rendering
messages[:i] with the generation prompt (so its end-of-turn token is supervised, the template's
assistant header is not). Templates must render each conversation as an extension of its
prefixes; a template that rewrites earlier turns is refused with the row named.
"""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from ..drafter import eligible_anchors
from ..jsonl import DataError, read_jsonl

ROLES = ("system", "user", "assistant", "tool")


def checked_messages(row: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: messages[{i}] must be {{'role': one of {ROLES}, 'content': str}}, got {m!r:.120}.")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render(tokenizer, messages: Sequence[Mapping[str, str]], generation_prompt: bool, chat_kwargs: Mapping[str, Any]) -> list[int]:
    return list(tokenizer.apply_chat_template(
        list(messages), tokenize=True, return_dict=False, add_generation_prompt=generation_prompt, **chat_kwargs
    ))


def tokenize_conversation(
    tokenizer, messages: Sequence[Mapping[str, str]], chat_kwargs: Mapping[str, Any], where: str
) -> tuple[list[int], list[bool]]:
    """-> (token ids, loss mask) of a whole conversation; assistant turns supervised."""
    ids = render(tokenizer, messages, False, chat_kwargs)
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(render(tokenizer, messages[:i], True, chat_kwargs)) if i else 0
        upto = render(tokenizer, messages[: i + 1], False, chat_kwargs)
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


def load_conversations(path: str | Path, tokenizer, max_length: int, chat_kwargs: Mapping[str, Any]) -> list[Example]:
    """Tokenized, truncated examples with at least one block anchor (two adjacent supervised tokens)."""
    examples = []
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        ids, mask = tokenize_conversation(tokenizer, checked_messages(row, where), chat_kwargs, where)
        ids, mask = ids[:max_length], mask[:max_length]
        example = Example(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))
        if eligible_anchors(example.loss_mask[None]).any():
            examples.append(example)
    if not examples:
        raise DataError(
            f"{path}: no usable training conversation (each needs an assistant turn of at least 2 tokens within "
            f"max_length={max_length}); run `lilicorr regenerate` first or check the file."
        )
    return examples


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask [b, T] int64; loss_mask [b, T] bool."""
    t = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), t), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), t), dtype=torch.long)
    loss = torch.zeros((len(examples), t), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n], attn[i, :n], loss[i, :n] = e.input_ids, 1, e.loss_mask
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def epoch_batches(num_examples: int, batch_size: int, seed: int, epoch: int, rank: int, world: int) -> list[list[int]]:
    """This rank's batches of one epoch: a seeded shuffle, dealt round-robin; every rank gets the
    same number of batches (the tail that does not fill all ranks is dropped)."""
    order = list(range(num_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    per_step = batch_size * world
    steps = max(1, len(order) // per_step)
    order = (order * (per_step // max(len(order), 1) + 1))[: steps * per_step]  # tiny data: repeat to fill
    return [order[s * per_step + rank : (s + 1) * per_step : world] for s in range(steps)]
