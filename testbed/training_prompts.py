"""Training prompts from sources disjoint from every evaluation set:

  self      prompts the target writes itself: continuations of its chat template's user-turn
            prefix (e.g. "<|im_start|>user\\n") sampled at T = 1 until the end of the turn
  code      Python functions from the standard library on this machine (source + docstrings)
  prose     module and class docstrings of the same standard library

Every prompt that equals an evaluation prompt or shares an 8-word shingle with one is dropped
(`disjoint`), and regeneration is also given the evaluation prompts as --exclude.
"""
from __future__ import annotations

import ast
import random
import re
import sysconfig
import textwrap
from pathlib import Path

SENTINEL = "\x00USER-TURN\x00"
SHINGLE = 8  # words
CODE_TEMPLATES = (
    "Explain what this Python function does, step by step:\n\n```python\n{src}\n```",
    "Write a Python function `{name}` that does the following:\n\n{doc}",
    "Review this Python code and suggest improvements:\n\n```python\n{src}\n```",
)
PROSE_TEMPLATES = (
    "Summarize the following text in a few sentences:\n\n{doc}",
    "Rewrite the following text in plain, simple language:\n\n{doc}",
    "Write a short essay on the topic of this passage:\n\n{doc}",
)


def user_turn_prefix(tokenizer) -> str:
    """Text the chat template puts before a user message's content (system prompt included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False, add_generation_prompt=False)
    if SENTINEL not in text:
        raise ValueError("the chat template does not render the user message's content verbatim; cannot find the user-turn prefix.")
    return text[: text.index(SENTINEL)]


def self_prompts(model, tokenizer, count: int, max_new_tokens: int, batch_size: int, seed: int) -> list[str]:
    """`count` samples (T = 1, no top-k/top-p) of the target continuing its own user-turn prefix;
    only samples that end the turn are kept (duplicates dropped), so fewer may come back."""
    import torch

    prefix = tokenizer(user_turn_prefix(tokenizer), add_special_tokens=False)["input_ids"]
    stops = stop_ids(tokenizer)
    torch.manual_seed(seed)
    out, seen = [], set()
    for start in range(0, count, batch_size):
        n = min(batch_size, count - start)
        x = torch.tensor([prefix] * n, device=model.device)
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                               max_new_tokens=max_new_tokens, eos_token_id=sorted(stops),
                               pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops))
        for row in y[:, len(prefix):].tolist():
            ends = [i for i, t in enumerate(row) if t in stops]
            if not ends:
                continue  # the turn never ended: a cut-off prompt
            text = tokenizer.decode(row[: ends[0]], skip_special_tokens=True).strip()
            if len(text.split()) >= 3 and text not in seen:
                seen.add(text)
                out.append(text)
    return out


def stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return {int(i) for i in ids if i is not None}


def stdlib_snippets(max_files: int, seed: int, max_chars: int = 1500) -> tuple[list[tuple[str, str, str]], list[str]]:
    """-> (functions as (name, source, first docstring paragraph), module and class docstrings),
    from the Python standard library of this interpreter (seeded file sample, sorted paths)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    files = sorted(random.Random(seed).sample(files, min(max_files, len(files))))
    functions, passages = [], []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            doc = ast.get_docstring(node)
            if doc and min(200, max_chars // 2) <= len(doc) <= max_chars:
                passages.append(doc.strip())
        lines = source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                fdoc = ast.get_docstring(node)
                src = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
                if fdoc and min(120, max_chars // 2) <= len(src) <= max_chars and len(fdoc) >= 30:
                    functions.append((node.name, src, fdoc.split("\n\n")[0].strip()))
    return functions, passages


def snippet_prompts(count_code: int, count_prose: int, seed: int, max_files: int = 400, max_chars: int = 1500) -> tuple[list[str], list[str]]:
    functions, passages = stdlib_snippets(max_files, seed, max_chars)
    rng = random.Random(seed)
    rng.shuffle(functions)
    rng.shuffle(passages)
    code = [CODE_TEMPLATES[i % len(CODE_TEMPLATES)].format(name=n, src=s, doc=d) for i, (n, s, d) in enumerate(functions[:count_code])]
    prose = [PROSE_TEMPLATES[i % len(PROSE_TEMPLATES)].format(doc=d) for i, d in enumerate(passages[:count_prose])]
    return code, prose


def shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + SHINGLE]) for i in range(max(0, len(words) - SHINGLE + 1))}


def disjoint(candidates: list[str], evaluation: list[str]) -> tuple[list[str], int]:
    """Drop candidates equal to an evaluation prompt or sharing an 8-word shingle with one."""
    held = {t.strip() for t in evaluation}
    held_shingles = set().union(*(shingles(t) for t in evaluation)) if evaluation else set()
    kept = [c for c in candidates if c.strip() not in held and not (shingles(c) & held_shingles)]
    return kept, len(candidates) - len(kept)
