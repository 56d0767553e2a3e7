"""The exactness check at T > 0, against a server: seeded sampled requests, then the check of
benchmarks/served/sampled_check.py over them.

collect   every prompt is sent `--requests` times at `--temperature` with sampling_seed 0, 1, ... (POST /generate,
          token ids in and out, ignore_eos, `--max-new-tokens`), each answer appended to a JSONL file as {system,
          prompt, input_ids, output_ids, seed, temperature}. A (prompt, seed) already in the file is not sent again,
          so an interrupted run resumes. Prompts: a JSONL file of {prompt, input_ids}, or {prompt, messages} with
          --tokenizer (its chat template). SGLang 0.5.23 applies sampling_seed only under
          --enable-deterministic-inference; without it every request draws from the server's generator, which is what
          the test needs (independent draws); the seed names the record.
check     per system: `positions` (n, chi2, dof and the p-value of every tested position), `verification` (the
          server's start-up line naming its verification, from --startup-log) and `tau_t1` (tokens per verify block
          per seed, from `lilicorr bench run` results at T > 0, --tau-records) -> one summary JSON.

  python -m benchmarks sampling-exactness collect --url URL --system lilicorr --prompts P.jsonl \\
      --tokenizer TARGET_DIR --requests 2000 --max-new-tokens 16 --out records.jsonl
  python -m benchmarks sampling-exactness check TARGET_DIR records.jsonl [...] --out summary.json \\
      [--startup-log SYSTEM=SERVER_LOG ...] [--tau-records BENCH_RUN_RESULTS.jsonl]
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.served.gpu_client import post_json
from sglang_lilicorr.bench.metrics import tau
from sglang_lilicorr.bench.runner import read_results


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
                encoded = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)
                ids = [
                    int(t) for t in (encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)
                ]  # transformers 5: a BatchEncoding
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{path}:{k}: not a prompt row ({e}); expected {{prompt, input_ids}} or {{prompt, messages}}."
            ) from e
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


def generate(
    url: str, input_ids: list[int], seed: int, temperature: float, max_new_tokens: int, timeout: float = 300.0
) -> list[int]:
    body = {
        "input_ids": input_ids,
        "sampling_params": {
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
            "sampling_seed": seed,
        },
    }
    payload = post_json(url, "/generate", body, timeout)
    if not isinstance(payload.get("output_ids"), list):
        raise ValueError(f"{url}/generate answered without output_ids: {str(payload)[:200]}")
    return payload["output_ids"]


def collect(
    url: str,
    system: str,
    prompts: list[dict],
    requests: int,
    max_new_tokens: int,
    temperature: float,
    out: Path,
    concurrency: int = 32,
) -> int:
    """Send every (prompt, seed) not yet in out and append the answers; the number sent."""
    recorded = done(out)
    todo = [(p, seed) for p in prompts for seed in range(requests) if (p["prompt"], seed) not in recorded]
    lock = threading.Lock()
    out.parent.mkdir(parents=True, exist_ok=True)

    def one(item):
        prompt, seed = item
        output_ids = generate(url, prompt["input_ids"], seed, temperature, max_new_tokens)
        record = {
            "system": system,
            "prompt": prompt["prompt"],
            "input_ids": prompt["input_ids"],
            "output_ids": output_ids,
            "seed": seed,
            "temperature": temperature,
        }
        with lock, out.open("a") as f:
            f.write(json.dumps(record) + "\n")

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, todo))
    return len(todo)


VERIFICATION_LINES = (  # (what a server log says, first match wins): the line itself is the summary's `verification`
    "LILICORR verification",  # our worker's start-up line (serving/verification.py)
    "DFLASH non-greedy verification is unavailable",  # the device kit's greedy fallback (no sampling verifier)
    "DFLASH sampling pre-warm",  # SGLang's DFlash sampling verifier, warmed at start-up: T > 0 by rejection sampling
)


NO_SPECULATION = "no speculative verification named: SGLang's sampler alone"


def startup_verification(log: Path) -> str:
    """The line of a server log that names its verification (VERIFICATION_LINES, in that order), or NO_SPECULATION
    (a server without speculation)."""
    lines = Path(log).read_text(errors="replace").splitlines()
    for marker in VERIFICATION_LINES:
        found = next((line.strip()[-300:] for line in lines if marker in line), None)
        if found is not None:
            return found
    return NO_SPECULATION


def tau_per_seed(results: Path) -> dict[str, dict[str, float]]:
    """{system: {seed: tokens per verify block}} of `lilicorr bench run` results."""
    groups: dict = {}
    for r in read_results(results):
        groups.setdefault(r["system"], {}).setdefault(str(r["seed"]), []).append(r)
    return {
        system: {seed: round(tau(rs), 4) for seed, rs in sorted(seeds.items()) if tau(rs) is not None}
        for system, seeds in groups.items()
    }


def cmd_collect(p: argparse.ArgumentParser, args) -> int:
    if args.temperature <= 0 or args.requests < 1 or args.max_new_tokens < 1:
        p.error("--temperature must be > 0 and --requests, --max-new-tokens >= 1")
    try:
        prompts = read_prompts(args.prompts, args.tokenizer)
    except (OSError, ValueError) as e:
        p.error(str(e))
    sent = collect(
        args.url, args.system, prompts, args.requests, args.max_new_tokens, args.temperature, args.out, args.concurrency
    )
    print(f"{args.system}: {sent} requests sent, {len(done(args.out))} recorded in {args.out}")
    return 0


def cmd_check(p: argparse.ArgumentParser, args) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.served.sampled_check import position_pvalues, read_records

    if min(args.positions) < 1:
        p.error(f"--positions count from 1, got {args.positions}")
    logs = dict(item.partition("=")[::2] for item in args.startup_log)
    if any(not name or not path for name, path in logs.items()):
        p.error(f"--startup-log takes SYSTEM=LOG, got {args.startup_log}")
    try:
        systems = read_records(args.records)
        verification = {name: startup_verification(Path(path)) for name, path in logs.items()}
        taus = tau_per_seed(args.tau_records) if args.tau_records else {}
    except (OSError, ValueError) as e:
        p.error(str(e))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    summary = {
        system: {
            "positions": position_pvalues(model, records, args.positions, args.seed),
            "verification": verification.get(system),
            "tau_t1": taus.get(system, {}),
        }
        for system, records in systems.items()
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    for system, cells in summary.items():
        print(
            system,
            " ".join(f"pos {j}: p = {c['p']:.3g} (n = {c['n']})" for j, c in cells["positions"].items()),
            cells["tau_t1"],
        )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="seeded sampled requests -> records JSONL (resumable)")
    c.add_argument("--url", required=True)
    c.add_argument("--system", required=True, help="names the records: lilicorr, dflash, base")
    c.add_argument("--prompts", type=Path, required=True)
    c.add_argument("--tokenizer", help="the target's folder, for prompts given as messages")
    c.add_argument("--requests", type=int, default=2000, help="seeds per prompt")
    c.add_argument("--max-new-tokens", type=int, default=16)
    c.add_argument("--temperature", type=float, default=1.0)
    c.add_argument("--concurrency", type=int, default=32)
    c.add_argument("--out", type=Path, required=True)
    k = sub.add_parser(
        "check", help="the chi-square test per position, verification lines and tau per seed -> summary JSON"
    )
    k.add_argument("target", help="the target's HF folder")
    k.add_argument("records", nargs="+", type=Path, help="JSONL files of sampled outputs (collect)")
    k.add_argument("--positions", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    k.add_argument("--seed", type=int, default=0, help="seed of the probability integral transform's V draws")
    k.add_argument(
        "--startup-log", action="append", default=[], metavar="SYSTEM=LOG", help="a server's log: its verification line"
    )
    k.add_argument("--tau-records", type=Path, help="`lilicorr bench run` results at T > 0: tau per system and seed")
    k.add_argument("--out", type=Path, required=True, help="summary JSON (module docstring)")
    args = p.parse_args(argv)
    return {"collect": cmd_collect, "check": cmd_check}[args.command](p, args)
