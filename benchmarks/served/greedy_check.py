"""`python -m benchmarks greedy-check TARGET RESULTS...`: every greedy response a server returned (gpu_client's files)
checked against the teacher-forced target (sglang_lilicorr.reference.check: each token the target's greedy choice, or
a near-tie within --tol-ulps bf16 ulps); with --baseline, the byte-equal fraction against another run of the same
client (no speculation, or another commit's server: a change that should not move served outputs), replies paired by
phase, prompt and input, and where replies served one at a time differ, the token at which they part. Prints
GREEDY_CHECK PASS or FAIL (exit 0 / 1); differences from a baseline are reported, not judged."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json

import torch

from sglang_lilicorr.reference.check import check_greedy


def served_greedy_records(path: str) -> list[dict]:
    """Greedy records (temperature 0, no error) of a benchmarks/served/gpu_client.py result file (.json or .json.gz)."""
    records = json.loads((gzip.open if str(path).endswith(".gz") else open)(path, "rt").read())
    return [r for r in records if not r.get("error") and r["sampling"].get("temperature", 1.0) == 0]


def key(record: dict) -> tuple:
    """What pairs a reply with the baseline's: its phase (one at a time, or a concurrency), prompt and input ids."""
    return record.get("phase"), record["prompt"], tuple(record["input_ids"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks greedy-check",
        description="Check every greedy response a server returned (gpu_client JSON files) against the target.",
    )
    p.add_argument("model_dir", help="the target's HF folder")
    p.add_argument("results", nargs="+", help="gpu_client result files")
    p.add_argument("--tol-ulps", type=float, default=2.0, help="near-tie tolerance in bf16 ulps of the top logit")
    p.add_argument("--baseline", help="another run's result file: also report the byte-equal fraction against it")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    a = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, a.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=dtype).to(device).eval()
    baseline = {key(r): r["output_ids"] for r in served_greedy_records(a.baseline)} if a.baseline else {}
    ok = True
    for path in a.results:
        records = served_greedy_records(path)
        reports = [
            check_greedy(model, r["input_ids"], r.get("output_ids") or [], dtype=dtype, tol_ulps=a.tol_ulps)
            for r in records
        ]
        for r, rep in zip(records, reports):
            if not rep.ok:
                print(f"{path}: {r['prompt'][:60]!r}: {rep.summary()} {[dataclasses.astuple(m) for m in rep.failures]}")
        unchecked = [r for r in records if not r.get("output_ids")]  # a reply without its token ids is not checked
        for r in unchecked:
            print(f"{path}: {r['prompt'][:60]!r}: FAIL: no output token ids to check")
        fails = sum(not rep.ok for rep in reports) + len(unchecked)
        near = sum(len(rep.not_argmax) - len(rep.failures) for rep in reports)
        line = (
            f"{path}: {len(records)} greedy responses, {sum(rep.num_tokens for rep in reports)} tokens, "
            f"{fails} with a token that is not the target's greedy choice beyond {a.tol_ulps:g} bf16 ulp, "
            f"{near} near-tie tokens within it"
        )
        paired = [(r, baseline[key(r)]) for r in records if key(r) in baseline]
        if paired:
            line += f"; byte-equal with the baseline on {sum(r['output_ids'] == b for r, b in paired)}/{len(paired)}"
        print(line)
        for r, b in paired:
            if r["output_ids"] != b and r.get("phase") == "greedy":
                at = next(
                    (i for i, (x, y) in enumerate(zip(r["output_ids"], b)) if x != y), min(len(b), len(r["output_ids"]))
                )
                print(f"  {r['prompt'][:60]!r}: parts from the baseline at token {at} of {len(r['output_ids'])}")
        ok &= fails == 0
    print("GREEDY_CHECK", "PASS" if ok else "FAIL")
    return 0 if ok else 1
