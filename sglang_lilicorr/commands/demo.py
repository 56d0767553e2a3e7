"""`lilicorr demo`: LiLiCorr speculative decoding of SmolLM2-135M-Instruct on the CPU. For a few built-in prompts,
greedy decoding with the reference decoder drafts the DFlash argmax block and the LiLiCorr block on the same context,
commits the LiLiCorr block, shows how many tokens of each the target accepts, reports both taus, and checks every
emitted token against a float32 teacher-forced pass (`check_greedy`). The target comes from PyPI (about 93 MB)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

from ..cli_args import add_command, bounded, one_level_down, path_arg, with_help
from ..errors import UsageError

DEFAULT_DRAFT = Path(__file__).resolve().parents[2] / "checkpoints" / "smollm2-lilicorr"
PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the square of a number.",
    "List three colours of the rainbow.",
)
SHOWN_TOKENS = 8  # drafted tokens printed per block line
DEMO_HELP = {  # the --help texts of `lilicorr demo`
    "draft": "LiLiCorr draft folder (config.json + model.safetensors, as `lilicorr export` writes it); default: the "
    "shipped checkpoints/smollm2-lilicorr",
    "walk": "how a block is read off the lattice: greedy (the paper's walk, as served) or viterbi (the best path)",
    "prompt": "a prompt of your own, sent as one user turn (repeatable; replaces the three built-in prompts)",
    "max_new_tokens": "tokens generated per prompt, at most (>= 1)",
    "threads": "torch CPU threads (>= 0; 0 = torch's; 1: a busy machine)",
    "quiet": "print each prompt's text, tau and check only, not its per-block lines",
}


def register(subparsers) -> None:
    summary = (
        "speculative decoding of SmolLM2-135M-Instruct on the CPU: drafter argmax vs LiLiCorr blocks, tau, exactness"
    )
    p = add_command(subparsers, "demo", summary, __doc__)
    model = p.add_argument_group("model")
    model.add_argument("--draft", type=path_arg, default=DEFAULT_DRAFT)
    model.add_argument("--walk", choices=("greedy", "viterbi"), default="greedy")
    data = p.add_argument_group("data")
    data.add_argument("--prompt", action="append", metavar="TEXT")
    data.add_argument("--max-new-tokens", type=bounded(int, 1), default=48)
    p.add_argument_group("optimisation").add_argument("--threads", type=bounded(int, 0), default=0)
    p.add_argument_group("output").add_argument("--quiet", action="store_true")
    with_help(p, DEMO_HELP)
    p.set_defaults(func=run_demo)


@dataclasses.dataclass
class PromptReport:
    prompt: str
    text: str
    result: object  # reference.DecodeResult
    check: object  # reference.GreedyReport
    seconds: float


def render_block(index: int, block, decode: Callable[[list[int]], str]) -> list[str]:
    """Lines for one block: each draft's tokens, the accepted ones before the bar."""
    lines = [f"  block {index:3d} @ {block.anchor_pos:4d}  committed {block.committed}, +{len(block.emitted)} tokens"]
    for name, draft in block.drafts.items():
        m = block.accepted.get(name, 0)
        shown = [repr(decode([t])) for t in draft[:SHOWN_TOKENS]]
        acc, rej = shown[:m], shown[m:]
        more = " ..." if len(draft) > SHOWN_TOKENS else ""
        lines.append(f"    {name:<8s} accepted {m:2d}/{len(draft)}  {' '.join(acc)} | {' '.join(rej)}{more}")
    return lines


def pooled_tau(reports: list[PromptReport], name: str) -> float:
    """Mean tokens per block earned by draft `name` over every block of every prompt."""
    counts = [b.accepted[name] + 1 for r in reports for b in r.result.blocks if name in b.accepted]
    return sum(counts) / len(counts) if counts else float("nan")


def chat_ids(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def decode_prompts(decoder, model, tokenizer, prompts, max_new_tokens: int, progress) -> list[PromptReport]:
    from ..reference import check_greedy

    stop = {t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if isinstance(t, int)}
    reports = []
    for prompt in prompts:
        ids = chat_ids(tokenizer, prompt)
        t0 = time.time()
        result = decoder.generate(ids, max_new_tokens, stop_ids=stop, on_block=lambda b: progress(len(b.emitted)))
        seconds = time.time() - t0
        progress(1)  # the prefill token
        check = check_greedy(model, ids, result.output_ids)
        text = tokenizer.decode(result.output_ids, skip_special_tokens=True)
        reports.append(PromptReport(prompt, text, result, check, seconds))
    return reports


def print_report(reports: list[PromptReport], decode, quiet: bool, out=sys.stdout) -> bool:
    ok = True
    for i, r in enumerate(reports):
        res = r.result
        print(f"\n[{i + 1}] {r.prompt}\n  -> {r.text.strip()!r}", file=out)
        if not quiet:
            for k, block in enumerate(res.blocks):
                print("\n".join(render_block(k, block, decode)), file=out)
        taus = "  ".join(f"{name} {res.block_tau(name):.2f}" for name in res.blocks[0].drafts) if res.blocks else "-"
        print(
            f"  {len(res.output_ids)} tokens in {res.verify_count} blocks, {r.seconds:.1f} s; tokens/block: {taus}; "
            f"SGLang spec_accept_length {res.tau:.2f}\n  greedy check: {r.check.summary()}",
            file=out,
        )
        ok &= r.check.ok
    names = list(reports[0].result.blocks[0].drafts) if reports and reports[0].result.blocks else []
    print("\nSummary (tokens per verify block, all prompts; the target's own token counts as 1):", file=out)
    for name in names:
        print(f"  tau[{name}] = {pooled_tau(reports, name):.3f}", file=out)
    print(f"  every emitted token is the target's greedy choice: {'yes' if ok else 'NO'}", file=out)
    return ok


def run_demo(args: argparse.Namespace) -> int:
    if not (args.draft / "config.json").is_file():
        shipped = args.draft.resolve() == DEFAULT_DRAFT
        raise UsageError(
            f"no draft checkpoint at {args.draft}"
            + (", the shipped SmolLM2 LiLiCorr draft is not in this checkout yet" if shipped else ""),
            where="--draft",
            fix=one_level_down(
                args.draft,
                "train and export one (`lilicorr train ...`, then `lilicorr export RUN_DIR OUT_DIR`) "
                "and pass --draft OUT_DIR",
            ),
        )
    import torch
    from tqdm import tqdm

    from ..reference import speculative_decoder
    from .smollm2 import load_smollm2
    from ..drafter import load_draft

    if args.threads:
        torch.set_num_threads(args.threads)
    drafter, head = load_draft(args.draft)
    if head is None:
        print(f"note: {args.draft} has no LiLiCorr head; only the drafter's argmax block is drafted.", file=sys.stderr)
    model, tokenizer = load_smollm2()
    drafter, head = drafter.float(), None if head is None else head.float()
    decoder = speculative_decoder(model, drafter, head, walk=args.walk)
    prompts = args.prompt or list(PROMPTS)
    with tqdm(
        total=len(prompts) * args.max_new_tokens, desc="speculative decoding", unit="tok", file=sys.stderr
    ) as bar:
        reports = decode_prompts(decoder, model, tokenizer, prompts, args.max_new_tokens, bar.update)
    return 0 if print_report(reports, tokenizer.decode, args.quiet) else 1
