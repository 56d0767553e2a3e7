"""The `long-serve` step (with --long): each exported long draft, SGLang's DFLASH and no speculation served at long
inputs side by side on GPU 0: tau, tokens/s, failures with the fp32 check, every not-argmax token (long_inputs.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from benchmarks import save_json

from . import eval_sets, long_inputs
from .common import Step, device_name, enough_time, set_flags, speculation_args, to_out

LONG_PORT0 = 32100


def cmd_long_serve(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.served.gpu_client import post_json
    from sglang_lilicorr.reference.check import check_greedy
    from sglang_lilicorr.train.engine import SGLangServers, ServerSpec

    drafts, root = Path(args.work) / "drafts", Path(args.work) / "long"
    missing = [v for v in args.variants if v != "base" and not (drafts / v / "config.json").is_file()]
    if missing:
        raise SystemExit(
            f"{drafts}: no draft for {missing}; run `--long train` and `export` for a long-trained variant, "
            "or copy a draft folder there (dflash: a DFlash draft, e.g. the shipped checkpoints/smollm2-dflash)."
        )
    enough_time("long-serve", 3.0 + 0.25 * len(args.variants) * len(args.lengths))
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    render = lambda content: list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": content}],
            tokenize=True,  # noqa: E731
            add_generation_prompt=True,
            return_dict=False,
        )
    )
    sources = long_inputs.stdlib_sources(min_chars=6 * max(args.lengths))
    prompts = long_inputs.long_prompts(render, sources, args.lengths, args.per_length)
    root.mkdir(parents=True, exist_ok=True)
    eval_sets.write(prompts, root / "prompts.jsonl")
    # side by side on GPU 0, each with a fixed KV pool (default: c whole contexts), so servers starting together do not
    # race for memory
    kv_tokens = args.kv_tokens or args.concurrency * long_inputs.TARGET_CONTEXT
    base = set_flags(
        shlex.split(args.server_args),
        {
            "--context-length": str(long_inputs.TARGET_CONTEXT),
            "--mem-fraction-static": "0.9",
            "--max-running-requests": str(args.concurrency),
            "--max-total-tokens": str(kv_tokens),
        },
    )
    specs = [
        ServerSpec(args.target, LONG_PORT0 + i, "0", (*base, *speculation_args(v, drafts)), {}, v)
        for i, v in enumerate(args.variants)
    ]
    launcher = shlex.split(args.server_launch or "")  # tests: stand-ins that serve $PORT
    with SGLangServers.start(specs, root / "logs", launcher=launcher, warm_first=True):
        records = [
            r
            for i, v in enumerate(args.variants)
            for r in long_inputs.serve(f"http://127.0.0.1:{LONG_PORT0 + i}", v, prompts, args.concurrency, post_json)
        ]
    eval_sets.write(records, root / "records.jsonl")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    summary, mismatches = long_inputs.summarize(
        records, lambda r: check_greedy(model, r["input_ids"], r["output_ids"], tol_ulps=2.0)
    )
    eval_sets.write(mismatches, root / "not_argmax.jsonl")
    document = {
        "lengths": list(args.lengths),
        "per_length": args.per_length,
        "concurrency": args.concurrency,
        "max_new_tokens": long_inputs.MAX_NEW_TOKENS,
        "device": device_name(),
        "server_args": {s.name: " ".join(s.args) for s in specs},
        "drafts": summary,
    }
    save_json(root / "summary.json", document)
    print(json.dumps(summary, indent=1))
    long_inputs.plot(document, root / "summary.png")
    to_out(
        args.out,
        root / "summary.json",
        root / "summary.png",
        root / "not_argmax.jsonl",
        root / "records.jsonl",
        *sorted((root / "logs").glob("*.log")),
    )
    return 0


def arguments(parser) -> None:
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["lilicorr", "margin", "dflash", "base"],
        help="drafts in WORK/drafts (dflash: served by SGLang's DFLASH) and base (no speculation)",
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=list(long_inputs.LENGTHS))
    parser.add_argument("--per-length", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--kv-tokens", type=int, default=None, help="each server's KV pool in tokens (default: concurrency x 8,192)"
    )


STEP = Step(
    "long-serve",
    "(with --long) each exported long draft served at 1K / 4K / 8K input tokens: tau, tokens/s, failures",
    cmd_long_serve,
    arguments,
)
