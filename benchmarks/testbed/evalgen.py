"""The `evalgen` step: the target's own outputs on the evaluation prompts, T = 0 and T = 1 under seeds 0, 1, 2
(WORK/eval/outputs_T<t>_s<seed>.jsonl), through the same generator as `data`."""

from __future__ import annotations

from pathlib import Path

from .common import Step, enough_time, generator

EVAL_RUNS = ((0.0, 0), (1.0, 0), (1.0, 1), (1.0, 2))  # (temperature, seed) of the evaluation outputs


def cmd_evalgen(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.train.regenerate import Settings, play, prompt_plans

    enough_time("evalgen", 2.0)
    out = Path(args.work) / "eval"
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    plans = prompt_plans(args.eval_prompts)
    with generator(args, out / "logs", tokenizer) as (engine, described):
        for temperature, seed in EVAL_RUNS:
            stats = play(
                plans,
                out / f"outputs_T{temperature:g}_s{seed}.jsonl",
                tokenizer,
                engine,
                Settings(temperature=temperature, seed=seed, max_new_tokens=args.max_new_tokens),
            )
            print(f"[evalgen] T={temperature:g} seed {seed}: {stats.generated_tokens} tokens this call ({described})")
    return 0


def arguments(parser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=256)


STEP = Step(
    "evalgen",
    "the target's own outputs on the eval prompts: T = 0, and T = 1 under seeds 0, 1, 2",
    cmd_evalgen,
    arguments,
)
