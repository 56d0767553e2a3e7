"""Seeded sampled requests for the exactness check at T > 0 (sglang_lilicorr.reference.sampled_check): every prompt
is sent `--requests` times at `--temperature` with sampling_seed 0, 1, ... (POST /generate, token ids in and out,
ignore_eos, `--max-new-tokens`), and each answer appended to a JSONL file as {system, prompt, input_ids,
output_ids, seed, temperature}. A (prompt, seed) already in the file is not sent again, so an interrupted run
resumes. Prompts: a JSONL file of {prompt, input_ids}, or {prompt, messages} with --tokenizer (its chat template).

  python -m sglang_lilicorr.benchmarks.sampling_exactness --url URL --system lilicorr --prompts P.jsonl \\
      --tokenizer TARGET_DIR --requests 2000 --max-new-tokens 16 --out records.jsonl
"""
from __future__ import annotations

import argparse
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .client import post_json


def read_prompts(path: Path, tokenizer_dir: str | None) -> list[dict]:
    """[{prompt, input_ids}]; a malformed line, or messages without --tokenizer, is named with its line."""
    tokenizer = None
    rows = []
    for k, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            name = str(row["prompt"])
            if "input_ids" in row:
                ids = [int(t) for t in row["input_ids"]]
            else:
                if tokenizer_dir is None:
                    raise ValueError("it has messages, so pass --tokenizer TARGET_DIR")
                if tokenizer is None:
                    from transformers import AutoTokenizer

                    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
                ids = list(tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{k}: not a prompt row ({e}); expected {{prompt, input_ids}} or {{prompt, messages}}.") from e
        if not ids:
            raise ValueError(f"{path}:{k}: the prompt {name!r} has no tokens.")
        rows.append({"prompt": name, "input_ids": ids})
    if not rows:
        raise ValueError(f"{path}: no prompts.")
    return rows


def done(out: Path) -> set[tuple[str, int]]:
    """(prompt, seed) pairs already recorded in out."""
    if not out.is_file():
        return set()
    return {(r["prompt"], int(r["seed"])) for r in map(json.loads, filter(str.strip, out.read_text().splitlines()))}


def generate(url: str, input_ids: list[int], seed: int, temperature: float, max_new_tokens: int, timeout: float = 300.0) -> list[int]:
    body = {"input_ids": input_ids, "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens,
                                                         "ignore_eos": True, "sampling_seed": seed}}
    payload = post_json(url, "/generate", body, timeout)
    if not isinstance(payload.get("output_ids"), list):
        raise ValueError(f"{url}/generate answered without output_ids: {str(payload)[:200]}")
    return payload["output_ids"]


def collect(url: str, system: str, prompts: list[dict], requests: int, max_new_tokens: int, temperature: float, out: Path,
            concurrency: int = 32) -> int:
    """Send every (prompt, seed) not yet in out and append the answers; the number sent."""
    recorded = done(out)
    todo = [(p, seed) for p in prompts for seed in range(requests) if (p["prompt"], seed) not in recorded]
    lock = threading.Lock()
    out.parent.mkdir(parents=True, exist_ok=True)

    def one(item):
        prompt, seed = item
        output_ids = generate(url, prompt["input_ids"], seed, temperature, max_new_tokens)
        record = {"system": system, "prompt": prompt["prompt"], "input_ids": prompt["input_ids"], "output_ids": output_ids,
                  "seed": seed, "temperature": temperature}
        with lock, out.open("a") as f:
            f.write(json.dumps(record) + "\n")

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, todo))
    return len(todo)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_lilicorr.benchmarks.sampling_exactness", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--system", required=True, help="names the records: lilicorr, dflash, base")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--tokenizer", help="the target's folder, for prompts given as messages")
    p.add_argument("--requests", type=int, default=2000, help="seeds per prompt")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.temperature <= 0 or args.requests < 1 or args.max_new_tokens < 1:
        p.error("--temperature must be > 0 and --requests, --max-new-tokens >= 1")
    try:
        prompts = read_prompts(args.prompts, args.tokenizer)
    except (OSError, ValueError) as e:
        p.error(str(e))
    sent = collect(args.url, args.system, prompts, args.requests, args.max_new_tokens, args.temperature, args.out, args.concurrency)
    print(f"{args.system}: {sent} requests sent, {len(done(args.out))} recorded in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
