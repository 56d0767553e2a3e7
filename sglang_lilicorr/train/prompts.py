"""Where training prompts come from, and what keeps them apart from the evaluation sets: `magpie` (the target writes
its own user turns from its chat template, some steered by our system prompts) and `package` (prompts from Python's
standard library: functions, module and class docstrings). Prompts equal to an evaluation prompt or sharing an 8-word
shingle with one are dropped (`EvalGuard`)."""

from __future__ import annotations

import ast
import dataclasses
import random
import re
import sysconfig
import textwrap
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..jsonl import DataError, read_jsonl

SENTINEL = "\x00USER-TURN\x00"
SHINGLE = 8  # words

# (share of Magpie samples, system prompt or None for the template's own)
STEERING: tuple[tuple[float, str | None], ...] = (
    (0.40, None),
    (0.15, "You are a patient maths tutor. The user asks you to solve a maths word problem step by step."),
    (0.15, "You are an expert Python programmer. The user asks you to write, explain or fix Python code."),
    (0.15, "You are a skilled writer. The user asks you to write an essay, a story, an email, a letter or an article."),
    (0.15, "You are a science teacher. The user asks you a question about physics, chemistry, biology or medicine."),
)
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


def user_turn_prefix(tokenizer, history: Sequence[Mapping[str, str]] = (), system: str | None = None) -> str:
    """What the chat template puts before the next user message's content (system prompt and `history` included)."""
    messages = ([{"role": "system", "content": system}] if system else []) + list(history)
    text = tokenizer.apply_chat_template(
        messages + [{"role": "user", "content": SENTINEL}], tokenize=False, add_generation_prompt=False
    )
    if SENTINEL not in text:
        raise ValueError(
            "the chat template does not render a user message's content verbatim; the user-turn prefix cannot be found."
        )
    return text[: text.index(SENTINEL)]


def steering_plan(count: int, seed: int) -> list[str | None]:
    """The system prompt of each of `count` Magpie samples, in the STEERING shares, shuffled."""
    plan: list[str | None] = []
    for share, system in STEERING:
        plan += [system] * round(share * count)
    plan = (plan + [None] * count)[:count]
    random.Random(seed).shuffle(plan)
    return plan


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids that end a turn: the tokenizer's EOS and the ChatML end marker when it exists."""
    ids = {tokenizer.eos_token_id}
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return sorted(int(i) for i in ids if i is not None)


def stdlib_snippets(seed: int, max_chars: int = 1500) -> tuple[list[tuple[str, str, str]], list[str]]:
    """-> (functions as (name, source, first docstring paragraph), module and class docstrings) of this
    interpreter's standard library (no tests, no private modules)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo"}
    files = sorted(
        p for p in root.rglob("*.py") if not p.name.startswith("_") and not skip & set(p.relative_to(root).parts)
    )
    functions, passages = [], []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
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
    rng = random.Random(seed)
    rng.shuffle(functions)
    rng.shuffle(passages)
    return functions, passages


def package_prompts(count: int, seed: int, max_chars: int = 1500) -> list[str]:
    """`count` standard-library prompts, two code prompts per prose one (fewer if the library has fewer)."""
    functions, passages = stdlib_snippets(seed, max_chars)
    n_code = min(len(functions), count - min(len(passages), count // 3))
    code = [
        CODE_TEMPLATES[i % len(CODE_TEMPLATES)].format(name=n, src=s, doc=d)
        for i, (n, s, d) in enumerate(functions[:n_code])
    ]
    prose = [
        PROSE_TEMPLATES[i % len(PROSE_TEMPLATES)].format(doc=d) for i, d in enumerate(passages[: count - len(code)])
    ]
    return code + prose


def normalised(text: str) -> str:
    """The key prompts are deduplicated by: lower case, words only."""
    return " ".join(re.findall(r"\w+", text.lower()))


def shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + SHINGLE]) for i in range(max(0, len(words) - SHINGLE + 1))}


@dataclasses.dataclass
class EvalGuard:
    """Evaluation prompts a training prompt must not equal or share an 8-word shingle with."""

    texts: set[str]
    shingle_set: set[tuple[str, ...]]

    @classmethod
    def of(cls, evaluation: Iterable[str]) -> "EvalGuard":
        evaluation = list(evaluation)
        return cls(
            {normalised(t) for t in evaluation}, set().union(*map(shingles, evaluation)) if evaluation else set()
        )

    def overlaps(self, text: str) -> bool:
        return normalised(text) in self.texts or bool(shingles(text) & self.shingle_set)


def dedup_and_guard(texts: Iterable[str], guard: EvalGuard, seen: set[str]) -> tuple[list[str], dict[str, int]]:
    """Texts of >= 3 words not `seen` (updated) nor overlapping evaluation -> (kept, drop counts by reason)."""
    kept, dropped = [], {"short": 0, "duplicate": 0, "overlaps_eval": 0}
    for text in texts:
        key = normalised(text)
        if len(key.split()) < 3:
            dropped["short"] += 1
        elif key in seen:
            dropped["duplicate"] += 1
        elif guard.overlaps(text):
            dropped["overlaps_eval"] += 1
        else:
            seen.add(key)
            kept.append(text)
    return kept, dropped


def user_texts(row: Mapping[str, Any]) -> list[str]:
    """The user turns of a prompt or evaluation row: `text`, `turns` (strings) or user `messages`."""
    if isinstance(row.get("text"), str):
        return [row["text"]]
    if isinstance(row.get("turns"), list) and all(isinstance(t, str) for t in row["turns"]):
        return list(row["turns"])
    return [
        m["content"]
        for m in row.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    ]


def eval_guard(path: str | Path | None) -> EvalGuard | None:
    """The evaluation prompts of a prompt file (text / turns / messages rows) as a guard."""
    if path is None:
        return None
    texts = [t for _, row in read_jsonl(path) for t in user_texts(row)]
    if not texts:
        raise DataError(
            "no evaluation prompts in it", where=str(path), fix="rows need `text`, `turns` or user `messages`"
        )
    return EvalGuard.of(texts)


def check_disjoint(path: str | Path, guard: EvalGuard) -> None:
    """Refuse a conversations file with a user turn that overlaps an evaluation prompt, naming its line."""
    for number, row in read_jsonl(path):
        hit = next((t for t in user_texts(row) if guard.overlaps(t)), None)
        if hit is not None:
            raise DataError(
                f"a user turn equals an evaluation prompt or shares an 8-word shingle with one ({hit[:60]!r}...)",
                where=f"{path}:{number}",
                fix="remove it (training on evaluation prompts inflates tau)",
            )
