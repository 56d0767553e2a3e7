"""Acceptance length tau of every system on the held-out prompts, measured by the PyTorch
reference speculative decoder (`sglang_lilicorr.reference`), batch 1.

A job is one (system, temperature, seed, prompt). Jobs are dealt round-robin to W worker
processes sharing the GPU (the decoder is launch-bound at batch 1, so several processes keep the
GPU busier); each appends one JSON row per finished job to WORK/eval/results-<rank>.jsonl, and a
rerun skips the jobs already there, so an interrupted evaluation resumes. Workers stop taking
jobs at the deadline.

Row counts (SGLang convention, see reference/decoder.py): `tokens` completion tokens (the first
from the prefill), `blocks` verify blocks; tau = sum tokens / sum blocks (block-weighted).
At T = 0 every draft a decoder proposes is scored on the committed blocks' contexts:
`draft_tokens[name]` = sum over blocks of (accepted + 1), `draft_blocks[name]` blocks.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from pathlib import Path

from variants import SEEDS, SYSTEMS


@dataclasses.dataclass(frozen=True)
class Job:
    system: str
    temperature: float
    seed: int
    set: str
    prompt_id: str

    @property
    def key(self) -> str:
        return f"{self.system}|{self.temperature:g}|{self.seed}|{self.prompt_id}"


def plan(systems: list[str], prompts: list[dict], seeds=SEEDS) -> list[Job]:
    """T = 0 once (seed 0); T > 0 once per seed. Prompt-major, so a partial run covers every system."""
    jobs = []
    for p in prompts:
        for name in systems:
            for t in SYSTEMS[name].temperatures:
                for seed in (seeds if t > 0 else (0,)):
                    jobs.append(Job(name, t, seed, p["set"], p["id"]))
    return jobs


def read_rows(result_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(result_dir.glob("results-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a torn last line of an interrupted worker: that job reruns
    return rows


def decode_one(decoder, tokenizer, text: str, job: Job, max_new_tokens: int, stops: set[int]) -> dict:
    import torch

    ids = list(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True, return_dict=False,
                                             add_generation_prompt=True))
    torch.manual_seed(zlib.crc32(f"{job.seed}/{job.prompt_id}".encode()))  # CPU and CUDA generators
    t0 = time.perf_counter()
    res = decoder.generate(ids, max_new_tokens, temperature=job.temperature, stop_ids=stops)
    seconds = time.perf_counter() - t0
    names = sorted({n for b in res.blocks for n in b.accepted})
    return {
        **dataclasses.asdict(job), "key": job.key, "prompt_tokens": len(ids), "tokens": len(res.output_ids),
        "blocks": res.verify_count, "seconds": seconds,
        "draft_tokens": {n: sum(b.accepted[n] + 1 for b in res.blocks if n in b.accepted) for n in names},
        "draft_blocks": {n: sum(n in b.accepted for b in res.blocks) for n in names},
    }


def worker(rank: int, world: int, opts: dict) -> int:
    """Run this rank's share of the jobs not yet done; -> jobs finished."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_lilicorr.reference import speculative_decoder
    from sglang_lilicorr.drafter import load_draft
    from training_prompts import stop_ids

    result_dir = Path(opts["result_dir"])
    done = {r["key"] for r in read_rows(result_dir)}
    jobs = [j for j in [Job(**d) for d in opts["jobs"]][rank::world] if j.key not in done]
    if not jobs:
        return 0
    if world > 1:  # processes share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(opts["target"])
    model = AutoModelForCausalLM.from_pretrained(opts["target"], dtype=dtype).to(device).eval()
    stops = stop_ids(tokenizer)
    texts = {p["id"]: p["text"] for p in opts["prompts"]}
    drafts, decoders = {}, {}
    finished = 0
    with (result_dir / f"results-{rank}.jsonl").open("a") as out:
        for job in jobs:
            if time.time() > opts["deadline"]:
                break
            system = SYSTEMS[job.system]
            if system.variant not in drafts:
                drafter, head = load_draft(Path(opts["drafts"]) / system.variant)
                drafts[system.variant] = (drafter.to(device, dtype), None if head is None else head.to(device, dtype))
            if job.system not in decoders:
                drafter, head = drafts[system.variant]
                decoders[job.system] = speculative_decoder(model, drafter, head, walk=system.walk, commit=system.commit)
            row = decode_one(decoders[job.system], tokenizer, texts[job.prompt_id], job, opts["max_new_tokens"], stops)
            row["device"] = torch.cuda.get_device_name() if cuda else "cpu"
            out.write(json.dumps(row) + "\n")
            out.flush()
            finished += 1
    return finished


def _worker_entry(rank: int, world: int, opts: dict, queue) -> None:
    queue.put((rank, worker(rank, world, opts)))


def evaluate(opts: dict, workers: int) -> dict:
    """Run every job not done yet on `workers` processes (1 = in this process) -> counts."""
    Path(opts["result_dir"]).mkdir(parents=True, exist_ok=True)
    if workers <= 1:
        finished = worker(0, 1, opts)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker_entry, args=(r, workers, opts, queue)) for r in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"evaluation worker(s) {bad} failed (see the traceback above); rerun `eval` to resume.")
        finished = sum(queue.get()[1] for _ in procs)
    done = {r["key"] for r in read_rows(Path(opts["result_dir"]))}
    return {"finished_now": finished, "done": sum(Job(**j).key in done for j in opts["jobs"]),
            "planned": len(opts["jobs"])}
