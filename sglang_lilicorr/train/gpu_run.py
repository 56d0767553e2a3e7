"""A short real training run on one GPU, end to end, recording throughput:
prompts -> `regenerate` (the target's own greedy answers) -> `train` (bf16) -> `export`.

  python -m sglang_lilicorr.train.gpu_run --target SMOL_DIR --work /tmp/lilicorr_run --out $OUT/train_run.json

SMOL_DIR is the bf16 HF folder of SmolLM2-135M-Instruct (e.g. from `smol_convert.py`); its
tokenizer has no mask token, so `<empty_output>` (id 16) is used, as the device kit's DFLASH
draft does. The prompts are generated here (topic x task grid); every tenth is held out for
evaluation and excluded from the training data. The JSON summary has generation tokens/s,
training tokens/s (per logging window and median), the last losses and acceptance lengths,
and the exported draft directory (serve it with --speculative-algorithm DFLASH, or LiLiCorr).

On the lent GPU with the device kit (shared/device/README.md; `prepare.sh --smol` first), two
calls back to back on one warm machine; the image's own torch/transformers run this module:
  run(carry=[".dev/whl", ".dev/pkgs", ".dev/bin", ".dev/manifest.txt", ".dev/smolA"], timeout_s=300,
      command="bash .dev/bin/smol.sh install")
  run(carry=[".dev/smolB", ".dev/bin"], timeout_s=600, command="bash .dev/bin/smol.sh model && "
      "PYTHONPATH=$PWD python3 -m sglang_lilicorr.train.gpu_run --target /tmp/smol/model --out $OUT/train_run.json")
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

TOPICS = ["the ocean", "volcanoes", "a small bakery", "prime numbers", "the moon landing", "honeybees", "a rainy city",
          "chess openings", "photosynthesis", "a lost robot", "the printing press", "desert plants", "jazz music",
          "black holes", "a mountain village", "recycling", "the human heart", "ancient Rome", "electric cars", "owls",
          "a lighthouse keeper", "sorting algorithms", "coffee", "glaciers", "friendship", "the internet", "tea ceremonies",
          "rivers", "a time traveller", "vaccines", "bridges", "origami", "the Sahara", "penguins", "solar panels",
          "a detective", "rainbows", "bicycles", "libraries", "earthquakes"]
TASKS = ["Write a short story about {}.", "Explain {} to a ten-year-old.", "Give five facts about {}.",
         "Write a poem about {}.", "What are the pros and cons of {}?", "Describe {} in three paragraphs.",
         "Write a Python function related to {} and explain it.", "Summarize the history of {}."]


def write_prompts(work: Path) -> tuple[Path, Path]:
    rows = [{"id": f"{i}-{j}", "messages": [{"role": "user", "content": task.format(topic)}]}
            for i, topic in enumerate(TOPICS) for j, task in enumerate(TASKS)]
    train, held = work / "prompts_train.jsonl", work / "prompts_eval.jsonl"
    with train.open("w") as ft, held.open("w") as fe:
        for n, row in enumerate(rows):
            (fe if n % 10 == 0 else ft).write(json.dumps(row) + "\n")
    return train, held


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--work", default="/tmp/lilicorr_run")
    p.add_argument("--out", required=True, help="summary JSON path")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--gen-batch", type=int, default=96)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-anchors", type=int, default=64)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--gamma", type=float, default=0.25)
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--mask-token", default="<empty_output>")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .export import export_checkpoint, load_draft
    from .regenerate import regenerate, transformers_generator
    from .trainer import TrainConfig, train

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    summary: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
    prompts, held = write_prompts(work)

    tok = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16 if cuda else torch.float32)
    model = model.to("cuda" if cuda else "cpu").eval()
    data, eval_data = work / "train.jsonl", work / "eval.jsonl"
    t0 = time.perf_counter()
    gen = transformers_generator(model, tok, args.max_new_tokens)
    summary["regenerate_train"] = regenerate(prompts, data, tok, gen, batch_size=args.gen_batch)
    summary["regenerate_eval"] = regenerate(held, eval_data, tok, gen, batch_size=args.gen_batch)
    gen_s = time.perf_counter() - t0
    n_tokens = sum(len(tok(json.loads(line)["messages"][-1]["content"])["input_ids"])
                   for f in (data, eval_data) for line in f.read_text().splitlines())
    summary["regenerate_s"], summary["regenerate_tokens_per_s"] = gen_s, n_tokens / gen_s
    del model

    run_dir = work / "run"
    cfg = TrainConfig(target=args.target, data=str(data), eval_data=str(eval_data), output_dir=str(run_dir),
                      mask_token=args.mask_token, draft_layers=args.draft_layers, gamma=args.gamma, max_steps=args.steps,
                      batch_size=args.batch_size, num_anchors=args.num_anchors, max_length=args.max_length,
                      log_every=10, save_every=args.steps, bf16=cuda)
    t0 = time.perf_counter()
    summary["last_metrics"] = train(cfg)
    summary["train_s"] = time.perf_counter() - t0
    windows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [w["tokens_per_s"] for w in windows[1:]] or [w["tokens_per_s"] for w in windows]  # first window has warm-up
    summary["train_tokens_per_s_windows"] = [w["tokens_per_s"] for w in windows]
    summary["train_tokens_per_s_median"] = statistics.median(rates)
    summary["loss_curve"] = [(w["step"], w["loss/total"]) for w in windows]
    draft = export_checkpoint(run_dir, work / "draft")
    load_draft(draft)
    summary["draft_dir"] = str(draft)
    summary["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    Path(args.out).write_text(json.dumps(summary, indent=2, default=lambda v: None))
    print(json.dumps({k: summary[k] for k in ("device", "regenerate_tokens_per_s", "train_tokens_per_s_median", "train_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
