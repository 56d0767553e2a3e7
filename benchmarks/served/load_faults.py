"""`python -m benchmarks faults`: a server under load and faults, then a check that it is whole again.

N concurrent clients (default 64) send requests back to back for a given duration against an
OpenAI-compatible SGLang server. Each request is one of (seeded, per client):
  normal      a prompt of mixed length (--prompt-words, cut to what fits the context with max_tokens),
              half /v1/chat/completions, half /generate,
              non-streaming; must complete (HTTP 200) with its stats present: /generate's `meta_info`,
              the chat API's `usage`, and with --expect-spec the spec stats (`spec_verify_ct`)
  disconnect  a quarter of them: a streaming chat request that we close after 1-4 chunks; must not
              fail before it starts streaming
  too_long    max_tokens as large as the whole context: must be rejected (HTTP 4xx), or complete
              if the server truncates (--allow-auto-truncate-input)
  bad_params  a negative temperature, top_p > 1 or min_p > 1: must be rejected (HTTP 4xx)
Outcome of each request: completed, rejected (HTTP 4xx), disconnected (by us) or failed (HTTP 5xx,
a broken connection, a missing stat), written one JSON line per request to OUT/requests.jsonl.

Afterwards: GET /health must answer 200 (SGLang's scheduler checks its memory pools whenever it
goes idle and, with SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE on, its default, dies on a leak), and
the KV pool must return to empty: GET /v1/loads, polled until no request runs or waits, must report
num_used_tokens == 0 (the tokens held by requests: SGLang counts them as max_total_num_tokens minus
the free and the evictable radix-cache tokens, so cached prefixes do not count). OUT/summary.json
holds the counts, the violations and these checks; exit 0 when everything held, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import List, Optional

from sglang_lilicorr.bench.cli import check_listening
from sglang_lilicorr.cli_args import Parser, run as run_command
from sglang_lilicorr.errors import UsageError
from sglang_lilicorr.ownership import claim_report_folder, write_atomic
from sglang_lilicorr.bench.client import (
    API_PATHS,
    Sampling,
    ServerError,
    chat_body,
    generate_body,
    parse_chat,
    parse_generate,
)

KINDS = ("normal", "disconnect", "too_long", "bad_params")
KIND_WEIGHTS = (0.55, 0.25, 0.1, 0.1)
BAD_PARAMS = ({"temperature": -1.0}, {"top_p": 1.5}, {"min_p": 2.0})


@dataclass
class Request:
    client: int
    index: int
    kind: str
    api: str
    prompt_words: int
    max_tokens: int
    outcome: str = "failed"  # completed | rejected | disconnected | failed
    status: Optional[int] = None
    stats: bool = False  # meta_info / usage (and spec stats with --expect-spec) present
    error: str = ""
    start: float = 0.0
    end: float = 0.0


@dataclass(frozen=True)
class FaultConfig:
    url: str
    clients: int = 64
    duration_s: float = 300.0
    context_length: int = 0  # 0: ask the server (GET /v1/models)
    max_tokens: int = 128
    prompt_words: tuple = (16, 256, 1024)
    expect_spec: bool = False
    model: str = "default"
    seed: int = 0
    request_timeout_s: float = 300.0
    drain_timeout_s: float = 60.0


TOKENS_PER_WORD = 5  # a prompt word "w<0-999>" and its space: at most 5 tokens under any byte-level BPE
TEMPLATE_TOKENS = 64  # the instruction and the chat template around the words


def prompt(words: int, rng: random.Random) -> str:
    return "Continue this list: " + " ".join(f"w{rng.randrange(1000)}" for _ in range(words))


def fitting_words(config: FaultConfig) -> int:
    """The most prompt words whose request (prompt + max_tokens) still fits the server's context, so
    every request but the `too_long` ones is one the server must serve."""
    return max(1, (config.context_length - config.max_tokens - TEMPLATE_TOKENS) // TOKENS_PER_WORD)


def plan(config: FaultConfig, client: int, index: int, rng: random.Random) -> tuple:
    """(Request, request body) of one request of a client."""
    kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
    api = "chat" if kind != "normal" or rng.random() < 0.5 else "generate"
    words = min(rng.choice(config.prompt_words), fitting_words(config))
    max_tokens = config.context_length if kind == "too_long" else config.max_tokens
    messages = [{"role": "user", "content": prompt(words, rng)}]
    sampling = Sampling(temperature=rng.choice((0.0, 1.0)), max_tokens=max_tokens, seed=rng.randrange(1 << 16))
    body = chat_body(messages, sampling, config.model) if api == "chat" else generate_body(messages, sampling)
    if kind == "disconnect":
        body["stream"] = True
    if kind == "bad_params":
        body.update(rng.choice(BAD_PARAMS))
    return Request(client, index, kind, api, words, max_tokens), body


async def send(session, config: FaultConfig, request: Request, body: dict, rng: random.Random) -> None:
    """Sends one request and records its outcome in `request`."""
    import aiohttp

    request.start = time.time()
    try:
        async with session.post(config.url.rstrip("/") + API_PATHS[request.api], json=body) as resp:
            request.status = resp.status
            if 400 <= resp.status < 500:
                request.outcome, request.error = "rejected", (await resp.text())[:200]
            elif resp.status != 200:
                request.error = (await resp.text())[:200]
            elif request.kind == "disconnect":
                await read_then_close(resp, request, rng.randint(1, 4))
            else:
                check_stats(request, json.loads(await resp.text()), config.expect_spec)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, ServerError) as e:
        request.outcome, request.error = "failed", f"{type(e).__name__}: {e}"[:200]
    request.end = time.time()


async def read_then_close(resp, request: Request, chunks: int) -> None:
    """Reads `chunks` server-sent events of a stream, then drops the connection."""
    seen = 0
    async for line in resp.content:
        if line.strip() == b"data: [DONE]":
            request.outcome = "completed"
            return
        seen += line.startswith(b"data:")
        if seen >= chunks:
            resp.close()
            request.outcome = "disconnected"
            return
    request.outcome, request.error = "failed", "the stream ended without [DONE]"


def check_stats(request: Request, payload, expect_spec: bool) -> None:
    """A completed request with its stats (parse_* raises ServerError when they are missing)."""
    verify_ct = (parse_chat if request.api == "chat" else parse_generate)(payload).spec_verify_ct
    request.stats = verify_ct is not None or not expect_spec
    request.outcome = "completed" if request.stats else "failed"
    if not request.stats:
        request.error = "no spec stats (spec_verify_ct) in the response"


def violation(request: Request) -> Optional[str]:
    """What went wrong with a request, given its kind; None if it behaved."""
    allowed = {
        "normal": ("completed",),
        "disconnect": ("completed", "disconnected"),
        "too_long": ("rejected", "completed"),
        "bad_params": ("rejected",),
    }[request.kind]
    if request.outcome in allowed:
        return None
    return (
        f"client {request.client} request {request.index} ({request.kind}, {request.api}): "
        f"{request.outcome} {request.error}"
    )


async def client_loop(session, config: FaultConfig, client: int, deadline: float, out: List[Request]) -> None:
    rng = random.Random(config.seed * 100_003 + client)
    index = 0
    while time.monotonic() < deadline:
        request, body = plan(config, client, index, rng)
        await send(session, config, request, body, rng)
        out.append(request)
        index += 1


async def get_json(session, url: str):
    async with session.get(url) as resp:
        return resp.status, (json.loads(await resp.text()) if resp.status == 200 else None)


async def server_state(session, config: FaultConfig) -> dict:
    """/v1/loads polled until no request runs or waits and no KV token is held (drain_timeout_s at
    most), then /health."""
    import aiohttp

    base = config.url.rstrip("/")
    state = {"health": None, "kv_empty": False, "loads": None}
    deadline = time.monotonic() + config.drain_timeout_s
    try:
        while not state["kv_empty"] and time.monotonic() < deadline:
            status, doc = await get_json(session, base + "/v1/loads?include=core")
            loads = (doc or {}).get("loads") or []
            state["loads"] = loads or f"HTTP {status}"
            state["kv_empty"] = bool(loads) and all(
                load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0 and load["num_used_tokens"] == 0
                for load in loads
            )
            if not state["kv_empty"]:
                await asyncio.sleep(0.5)
        async with session.get(base + "/health") as resp:
            state["health"] = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, TypeError, ValueError) as e:
        state["error"] = f"{type(e).__name__}: {e}"[:200]
    return state


async def context_length(session, config: FaultConfig) -> int:
    status, doc = await get_json(session, config.url.rstrip("/") + "/v1/models")
    try:
        return int(doc["data"][0]["max_model_len"])
    except (TypeError, KeyError, IndexError, ValueError) as e:
        raise UsageError(
            f"{config.url}/v1/models (HTTP {status}) gives no max_model_len", fix="pass --context-length"
        ) from e


async def run_async(config: FaultConfig) -> tuple:
    """-> (summary dict, the requests)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=config.clients)) as session:
        if not config.context_length:
            config = replace(config, context_length=await context_length(session, config))
        requests: List[Request] = []
        started = time.time()
        deadline = time.monotonic() + config.duration_s
        await asyncio.gather(*(client_loop(session, config, c, deadline, requests) for c in range(config.clients)))
        state = await server_state(session, config)
    violations = [v for v in map(violation, requests) if v]
    counts = {k: {} for k in KINDS}
    for r in requests:
        counts[r.kind][r.outcome] = counts[r.kind].get(r.outcome, 0) + 1
    ok = bool(requests) and not violations and state["health"] == 200 and state["kv_empty"]
    summary = {
        "config": asdict(config),
        "started": started,
        "finished": time.time(),
        "requests": len(requests),
        "outcomes": counts,
        "violations": len(violations),
        "first_violations": violations[:20],
        "server": state,
        "ok": ok,
    }
    return summary, requests


def run(config: FaultConfig, out_dir: Path) -> dict:
    """Runs the load, writes OUT/requests.jsonl and OUT/summary.json; returns the summary."""
    summary, requests = asyncio.run(run_async(config))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "requests.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in requests))
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
    return summary


def run_step(args) -> int:
    if args.clients < 1 or args.duration <= 0:
        raise UsageError(
            f"--clients {args.clients} --duration {args.duration} cannot run",
            where="--clients / --duration",
            fix="give at least one client and a positive duration",
        )
    claim_report_folder(args.out, create=False)  # a folder that cannot be this report's is refused first
    check_listening(args.url)  # nothing is written where no server answers
    claim_report_folder(args.out)  # before the load starts
    config = FaultConfig(
        url=args.url,
        clients=args.clients,
        duration_s=args.duration,
        context_length=args.context_length,
        max_tokens=args.max_tokens,
        prompt_words=tuple(args.prompt_words),
        expect_spec=args.expect_spec,
        model=args.model,
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        drain_timeout_s=args.drain_timeout,
    )
    summary = run(config, args.out)
    print(json.dumps({k: summary[k] for k in ("requests", "outcomes", "violations", "server", "ok")}))
    for line in summary["first_violations"]:
        print(f"  {line}", file=sys.stderr)
    print(f"{'ok' if summary['ok'] else 'FAILED'}: {args.out / 'summary.json'}, {args.out / 'requests.jsonl'}")
    return 0 if summary["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks faults`: this module's load and faults against a server, then its health and KV pool."""
    p = Parser(description=main.__doc__)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients, each sending requests back to back")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    p.add_argument(
        "--context-length", type=int, default=0, help="the server's context length (default: GET /v1/models)"
    )
    p.add_argument("--max-tokens", type=int, default=128, help="max tokens of the normal requests")
    p.add_argument("--prompt-words", type=int, nargs="+", default=[16, 256, 1024], help="prompt lengths to mix")
    p.add_argument("--expect-spec", action="store_true", help="normal requests must report spec stats (spec_verify_ct)")
    p.add_argument("--model", default="default", help="`model` field of chat requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds one request may take")
    p.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds to wait for the KV pool to empty afterwards"
    )
    p.add_argument("--out", type=Path, required=True, help="folder for summary.json and requests.jsonl")
    p.set_defaults(func=run_step)
    return run_command(p.parse_args(argv))
