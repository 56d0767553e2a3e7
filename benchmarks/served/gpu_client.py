"""Load a running SGLang server the way the LILICORR GPU check needs (stdlib HTTP + the model's
tokenizer), and save every response in one JSON file that the `greedy-check` step (and the device kit's own
checkers) read.

  python -m benchmarks gpu-client PORT MODEL_DIR OUT.json [--greedy 56] [--sampled 6]
         [--concurrency 1 2 4 8 16 32] [--max-new-tokens 64]

Phases: (1) --greedy prompts at temperature 0, one at a time; (2) --sampled prompts at T=1, one at a
time; (3) for each concurrency c, c requests at once, alternating T=0 and T=1 (mixed batches).
Checks, printed as `CLIENT_CHECK PASS|FAIL`: every request finished with output tokens, and every
speculative response carries SGLang's per-request spec stats (meta_info spec_verify_ct > 0,
spec_accept_length, spec_num_proposed_drafts). Exit status 1 on FAIL.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

TOPICS = [
    "the moon",
    "volcanoes",
    "honey bees",
    "the Roman Empire",
    "photosynthesis",
    "black holes",
    "chess",
    "coffee",
    "the Pacific Ocean",
    "penguins",
    "electric cars",
    "the printing press",
    "rainbows",
    "the human heart",
    "jazz",
    "deserts",
    "Mount Everest",
    "the internet",
    "dinosaurs",
    "glaciers",
    "tea",
    "the Eiffel Tower",
    "octopuses",
    "solar panels",
    "the Amazon rainforest",
    "bicycles",
    "thunderstorms",
    "the Great Wall of China",
]
TEMPLATES = ["Write one sentence about {}.", "Give two facts about {}."]
CODE = [
    "Write a Python function that returns the square of a number.",
    "Write a Python function that reverses a string.",
    "List the first five prime numbers.",
    "What is the capital of France? Answer in one sentence.",
]
SPEC_KEYS = ("spec_verify_ct", "spec_accept_length", "spec_num_proposed_drafts")


def post_json(url: str, path: str, body: dict, timeout: float = 300.0) -> dict:
    """One blocking POST of a JSON body (the tools that drive a server outside the async runner); the answer as
    JSON, or {"text": ...} where the server answered plain text."""
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read().decode() or "{}"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"text": text}


def prompts(n: int) -> list[str]:
    pool = CODE + [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    return [pool[i % len(pool)] + ("" if i < len(pool) else f" (variant {i // len(pool)})") for i in range(n)]


def generate(port: int, ids: list[int], sampling: dict, tries: int = 3) -> dict:
    """POST /generate; connection-level failures (reset, refused) are retried, HTTP errors are not."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"input_ids": ids, "sampling_params": sampling}).encode(),
    )
    t = time.time()
    for attempt in range(tries):
        try:
            out = json.loads(urllib.request.urlopen(req, timeout=180).read())
            break
        except urllib.error.HTTPError as e:
            return {"error": f"HTTP {e.code}: {e.read()[:500]!r}", "_latency_s": time.time() - t}
        except OSError as e:  # URLError, ConnectionResetError, timeouts
            if attempt == tries - 1:
                return {"error": repr(e), "_latency_s": time.time() - t}
            time.sleep(1.0)
    out["_latency_s"] = time.time() - t
    return out


def record(phase: str, prompt: str, ids: list[int], sampling: dict, r: dict) -> dict:
    meta = r.get("meta_info", {})
    keep = {
        k: v
        for k, v in meta.items()
        if k.startswith("spec") or k in ("completion_tokens", "prompt_tokens", "finish_reason", "e2e_latency")
    }
    return {
        "phase": phase,
        "prompt": prompt,
        "input_ids": ids,
        "sampling": sampling,
        "text": r.get("text"),
        "output_ids": r.get("output_ids"),
        "meta": keep,
        "latency_s": r["_latency_s"],
        "error": r.get("error"),
    }


def problems(rec: dict, speculative: bool) -> list[str]:
    if rec["error"]:
        return [rec["error"]]
    out = []
    if not rec["output_ids"]:
        out.append("no output tokens")
    if speculative:
        missing = [k for k in SPEC_KEYS if k not in rec["meta"]]
        if missing or rec["meta"].get("spec_verify_ct", 0) <= 0:
            out.append(f"spec stats missing {missing} in meta_info {rec['meta']}")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--greedy", type=int, default=56)
    p.add_argument("--sampled", type=int, default=6)
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--no-spec", action="store_true", help="the server does not speculate: skip the spec-stat check")
    a = p.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model_dir)

    def encode(text: str) -> list[int]:
        chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        return list(tok(chat, add_special_tokens=False)["input_ids"])

    greedy = {"temperature": 0, "max_new_tokens": a.max_new_tokens}
    sampled = {"temperature": 1.0, "max_new_tokens": a.max_new_tokens, "sampling_seed": 1}
    jobs = [("greedy", q, greedy) for q in prompts(a.greedy)] + [("sampled", q, sampled) for q in prompts(a.sampled)]
    records, t0 = [], time.time()
    for phase, q, sp in jobs:
        ids = encode(q)
        records.append(record(phase, q, ids, sp, generate(a.port, ids, sp)))
    print(f"sequential: {len(jobs)} requests in {time.time() - t0:.1f} s", flush=True)
    for c in a.concurrency:
        batch = [(q, encode(q), greedy if i % 2 == 0 else sampled) for i, q in enumerate(prompts(c))]
        t = time.time()
        with ThreadPoolExecutor(max_workers=c) as pool:
            outs = list(pool.map(lambda job: generate(a.port, job[1], job[2]), batch))
        records += [record(f"concurrent{c}", q, ids, sp, r) for (q, ids, sp), r in zip(batch, outs)]
        toks = sum(len(r.get("output_ids") or []) for r in outs)
        print(f"concurrency {c}: {toks} tokens in {time.time() - t:.2f} s", flush=True)
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)

    bad = [(i, r["phase"], msg) for i, r in enumerate(records) for msg in problems(r, not a.no_spec)]
    spec = [r["meta"] for r in records if r["meta"].get("spec_verify_ct")]
    if spec:
        mean_accept = sum(m.get("spec_accept_length", 0) for m in spec) / len(spec)
        print(
            f"spec stats on {len(spec)}/{len(records)} responses; mean spec_accept_length {mean_accept:.3f}; "
            f"example meta_info: {json.dumps(spec[0])}"
        )
    print(f"{len(records)} responses ({sum(r['sampling']['temperature'] == 0 for r in records)} greedy) -> {a.out}")
    for i, phase, msg in bad[:10]:
        print(f"  record {i} ({phase}): {msg}")
    print("CLIENT_CHECK", "FAIL" if bad else "PASS")
    raise SystemExit(1 if bad else 0)
