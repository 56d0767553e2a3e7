"""How far served greedy replies stray from the target's own greedy choice, in bf16 ulps: the served-speed rounds'
turns that hold token ids (paired.RoundPlan.record_ids: the chat API's sglext input_ids / output_ids) checked against
a teacher-forced fp32 pass of the target (sglang_lilicorr.reference.check, as `python -m benchmarks greedy-check`).

A reply's deviation is the largest deficit of an emitted token (top logit - its logit) in bf16 ulps of the top logit,
0 where every token is the argmax. Each distinct (input_ids, output_ids) is checked once: CACHE (a jsonl beside the
rounds, {"key", "worst_ulps", "beyond_tol", "tokens"}) keeps what was checked, so a later device call checks only the
replies it adds and a deadline may stop a call's check part way. `summarize` -> per concurrency and system: the worst
deviation, the replies with a token beyond `tol_ulps`, how many replies hold ids and how many of them were checked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable, Optional

CACHE = "greedy_ulps.jsonl"
TOL_ULPS = 2.0  # the project's served greedy check: within 2 bf16 ulps of the top logit is a near-tie

Check = Callable[[list, list], dict]  # (input_ids, output_ids) -> {"worst_ulps", "beyond_tol", "tokens"}


def reply_key(turn: dict) -> str:
    """The digest of a turn's prompt and reply token ids (identical replies share it)."""
    return hashlib.sha1(json.dumps([turn["input_ids"], turn["output_ids"]]).encode()).hexdigest()


def replies(records: Iterable[dict]) -> Iterable[tuple[dict, dict]]:
    """(record, turn) of every turn that holds token ids and a non-empty reply."""
    for rec in records:
        for turn in rec["turns"]:
            if turn.get("input_ids") and turn.get("output_ids"):
                yield rec, turn


def read_cache(path: Path) -> dict:
    """{key: check result} of a CACHE file (empty where there is none)."""
    if not Path(path).is_file():
        return {}
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in rows}


def check_new(records: Iterable[dict], cache: Path, check: Check, allows: Callable[[], bool] = lambda: True) -> int:
    """Checks every distinct reply of `records` not yet in `cache`, appending each result as it comes, while
    `allows()` (a deadline); -> how many it checked."""
    done, checked = read_cache(cache), 0
    with open(cache, "a") as out:
        for _, turn in replies(records):
            key = reply_key(turn)
            if key in done:
                continue
            if not allows():
                break
            done[key] = {"key": key, **check(turn["input_ids"], turn["output_ids"])}
            out.write(json.dumps(done[key]) + "\n")
            out.flush()
            checked += 1
    return checked


def summarize(records: Iterable[dict], checked: dict) -> dict:
    """{c (str): {system: {"worst_ulps", "beyond_tol", "replies", "checked", "tokens", "tokens_beyond_tol"}}} over the
    turns holding ids: the worst deviation, the replies and the tokens beyond the tolerance among those checked
    (`checked`: read_cache), worst_ulps None where none was."""
    out: dict = {}
    for rec, turn in replies(records):
        cell = out.setdefault(str(rec["concurrency"]), {}).setdefault(
            rec["system"],
            {"worst_ulps": None, "beyond_tol": 0, "replies": 0, "checked": 0, "tokens": 0, "tokens_beyond_tol": 0},
        )
        cell["replies"] += 1
        found = checked.get(reply_key(turn))
        if found is not None:
            cell["checked"] += 1
            cell["beyond_tol"] += found["beyond_tol"] > 0
            cell["tokens"] += found["tokens"]
            cell["tokens_beyond_tol"] += found["beyond_tol"]
            cell["worst_ulps"] = max(cell["worst_ulps"] or 0.0, found["worst_ulps"])
    return {c: out[c] for c in sorted(out, key=int)}


def fp32_check(target: str, tol_ulps: float = TOL_ULPS, device: Optional[str] = None) -> Check:
    """The check of a reply against `target` (an HF folder) in fp32 on `device` (CUDA where there is one)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sglang_lilicorr.reference.check import check_greedy

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).to(device).eval()

    def check(input_ids: list, output_ids: list) -> dict:
        report = check_greedy(model, input_ids, output_ids, tol_ulps=tol_ulps)
        worst = max((m.deficit / m.ulp for m in report.not_argmax), default=0.0)
        return {"worst_ulps": round(worst, 3), "beyond_tol": len(report.failures), "tokens": report.num_tokens}

    return check
