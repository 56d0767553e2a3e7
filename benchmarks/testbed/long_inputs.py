"""Long inputs on the SmolLM2 testbed (the paper's YaRN regime): packed long training conversations, long prompts
from packaged text, and each long-trained draft served at 1K, 4K and 8K input tokens.

The lineage (benchmarks/device/README.md, "Long inputs"): the `data` step as usual in WORK0; then, in another work
folder, `python -m benchmarks testbed --long --work WORK long-pack --source WORK0` packs WORK0's conversations into
WORK/data, `--long` trains with variants.LONG (max_length 4096, YaRN factor 2 from 4,096 positions: served to the
target's 8,192), e.g. `python -m benchmarks testbed --long --work WORK train lilicorr margin --init DIR`, then
`export` and `long-serve`.

  pack      consecutive conversations (a seeded order) joined into one multi-turn conversation until their rendered
            lengths add up to at least min_tokens (a later conversation's system turn is dropped)
  prompts   Python standard-library modules (packaged text, no evaluation set) as "read this module" chat prompts
            whose rendered length is `length` tokens (within LENGTH_SLACK below it)
  serve     each variant behind its server (a long draft under LILICORR; the baselines `dflash`, SGLang's DFLASH, and
            `base`, no speculation: the same bf16 target, so their near-ties show what the serving precision flips),
            every prompt greedy through /generate (token ids in and out) at concurrency c, one length after another:
            records in the shape of benchmarks/served/greedy_check.py's files
  summarize per variant and length: tau (tokens per verify block), tokens/s, failures (a request that failed, or a
            token that is not the fp32 target's greedy choice within 2 bf16 ulps), and every not-argmax token's deficit
"""

from __future__ import annotations

import random
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from sglang_lilicorr.reference.check import GreedyReport

LENGTHS = (1024, 4096, 7936)  # "8K": 7,936 input + MAX_NEW_TOKENS = SmolLM2's 8,192 positions
MAX_NEW_TOKENS = 256
TARGET_CONTEXT = 8192
LENGTH_SLACK = 32  # a prompt may be this many tokens shorter than its length (cuts fall on character bounds)
INSTRUCTION = "Read this Python module and summarize what it does, function by function."


def pack(rows: Sequence[dict], lengths: Sequence[int], min_tokens: int, seed: int) -> list[dict]:
    """Conversations rows[i] ({"messages"}, lengths[i] rendered tokens) in a seeded order, joined until each pack holds
    at least min_tokens; the last, shorter pack is dropped."""
    if len(rows) != len(lengths):
        raise ValueError(f"pack: {len(rows)} conversations but {len(lengths)} lengths.")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    packed, messages, total = [], [], 0
    for i in order:
        messages += [m for m in rows[i]["messages"] if not (messages and m["role"] == "system")]
        total += lengths[i]
        if total >= min_tokens:
            packed.append({"messages": messages})
            messages, total = [], 0
    return packed


def stdlib_sources(min_chars: int) -> list[tuple[str, str]]:
    """(module, source) of the standard library's top-level modules of at least min_chars characters, by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [
        (p.stem, text) for p in sorted(root.glob("*.py")) if len(text := p.read_text(errors="replace")) >= min_chars
    ]


def prompt_ids(render: Callable[[str], list[int]], source: str, length: int) -> list[int] | None:
    """The longest cut of `source` whose rendered prompt fits `length` tokens; None when even the whole source falls
    more than LENGTH_SLACK short of it. render(content) -> the chat prompt's token ids."""
    content = lambda n: f"{INSTRUCTION}\n\n```python\n{source[:n]}\n```"  # noqa: E731
    lo, hi = 0, len(source)
    while lo < hi:  # the largest n whose prompt fits
        mid = (lo + hi + 1) // 2
        if len(render(content(mid))) <= length:
            lo = mid
        else:
            hi = mid - 1
    ids = render(content(lo))
    return ids if length - LENGTH_SLACK <= len(ids) <= length else None


def long_prompts(
    render: Callable[[str], list[int]], sources: Sequence[tuple[str, str]], lengths: Sequence[int], per_length: int
) -> list[dict]:
    """[{prompt, length, input_ids}]: per length, the first per_length sources that fill it."""
    rows = []
    for length in lengths:
        found = 0
        for name, source in sources:
            ids = prompt_ids(render, source, length) if found < per_length else None
            if ids is not None:
                rows.append({"prompt": f"{name}@{length}", "length": length, "input_ids": ids})
                found += 1
        if found < per_length:
            raise ValueError(f"only {found} of {per_length} prompts of {length} tokens: too few long enough sources.")
    return rows


def serve(url: str, draft: str, prompts: Sequence[dict], concurrency: int, post: Callable[..., dict]) -> list[dict]:
    """Every prompt greedy through /generate, one length after another, `concurrency` at a time: a record each
    (reference.check's served shape, plus length, completion_tokens, spec_verify_ct, start, end)."""

    def one(p: dict) -> dict:
        record = {
            "draft": draft,
            "prompt": p["prompt"],
            "length": p["length"],
            "input_ids": p["input_ids"],
            "output_ids": [],
            "sampling": {"temperature": 0.0},
            "error": None,
            "start": time.time(),
        }
        try:
            answer = post(
                url,
                "/generate",
                {
                    "input_ids": p["input_ids"],
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS},
                },
            )
            meta = answer["meta_info"]
            record.update(
                output_ids=answer["output_ids"],
                completion_tokens=int(meta["completion_tokens"]),
                spec_verify_ct=meta.get("spec_verify_ct"),
            )
        except Exception as e:  # noqa: BLE001 -- a failed request is a result: counted, never fatal
            record["error"] = f"{type(e).__name__}: {e}"[:300]
        record["end"] = time.time()
        return record

    records = []
    for length in sorted({p["length"] for p in prompts}):
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            records += list(pool.map(one, [p for p in prompts if p["length"] == length]))
    return records


def summarize(records: Sequence[dict], check: Callable[[dict], "GreedyReport"]) -> tuple[dict, list[dict]]:
    """({draft: {length: cell}}, the not-argmax tokens): check(record) is reference.check's teacher-forced report.
    A cell: n, tau, tok_s, failures (requests that failed or hold a token past the check's tolerance), not_greedy
    (those of them that failed the check), not_argmax_tokens (every emitted token that is not the fp32 argmax,
    near-ties included) and worst_deficit_ulps (the largest of their logit deficits, in bf16 ulps of the top logit)."""
    out: dict = {}
    mismatches: list[dict] = []
    for draft in sorted({r["draft"] for r in records}):
        for length in sorted({r["length"] for r in records if r["draft"] == draft}):
            cell = [r for r in records if r["draft"] == draft and r["length"] == length]
            ok = [r for r in cell if not r["error"]]
            tokens = sum(r["completion_tokens"] for r in ok)
            blocks = sum(r["spec_verify_ct"] or 0 for r in ok)
            wall = max(r["end"] for r in cell) - min(r["start"] for r in cell)
            reports = [check(r) for r in ok]
            not_greedy = sum(not report.ok for report in reports)
            found = [
                {
                    "draft": draft,
                    "length": length,
                    "prompt": r["prompt"],
                    "position": m.position,
                    "emitted": m.emitted,
                    "argmax": m.argmax,
                    "deficit": round(m.deficit, 5),
                    "deficit_ulps": round(m.deficit / m.ulp, 3),
                    "past_tolerance": m.deficit > m.tol,
                }
                for r, report in zip(ok, reports)
                for m in report.not_argmax
            ]
            mismatches += found
            out.setdefault(draft, {})[str(length)] = {
                "n": len(cell),
                "tau": round(tokens / blocks, 4) if blocks else None,
                "tok_s": round(tokens / wall, 1) if wall > 0 else None,
                "failures": len(cell) - len(ok) + not_greedy,
                "not_greedy": not_greedy,
                "not_argmax_tokens": len(found),
                "worst_deficit_ulps": max((m["deficit_ulps"] for m in found), default=0.0),
            }
    return out, mismatches


def plot(summary: dict, path: Path) -> Path:
    """tau, tokens/s and requests with a token past the check's tolerance against input length, a line per variant
    (summary: long-serve's summary.json)."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for i, (variant, cells) in enumerate(sorted(summary["drafts"].items())):
        lengths = sorted(cells, key=int)
        for ax, key in zip(axes, ("tau", "tok_s", "not_greedy")):
            pts = [(int(n), cells[n][key]) for n in lengths if cells[n][key] is not None]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=variant, color=f"C{i}")
    for ax, label in zip(
        axes,
        ("tau (tokens per verify block)", "output tokens / s", "requests not greedy (of %d)" % summary["per_length"]),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(summary["lengths"], [str(n) for n in summary["lengths"]])
        ax.set_xlabel("input tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"long inputs, c = {summary['concurrency']}, {summary['max_new_tokens']} new tokens, {summary['device']}",
        fontsize=10,
    )
    return save(fig, path)
