"""The OpenAI API through a running server, as a client sees it (the `openai` package): chat and text completions,
streamed and not, with stop strings, max_tokens, logprobs with top_logprobs, n > 1 and seed, at T = 0 and, where
the server serves it (LILICORR with flashinfer), at T > 0. A speculative block commits several tokens at once, so
every reply is checked for what that could break, as it must behave without speculation:

  - nothing past max_tokens: at most max_tokens tokens, exactly max_tokens when finish_reason is "length";
  - nothing past a stop: the text holds no stop string; a stop string matched ends the text where it first begins
    in the decoded tokens, and only the last token completes it; a stop token is the last token;
  - finish_reason "stop" exactly when matched_stop is set; the text is the decoded tokens (up to a stop string);
  - logprobs: one entry per completion token, each with 1..top_logprobs alternatives;
  - n choices, indexed 0..n-1; usage.completion_tokens counts every choice's tokens.

Token ids come back through SGLang's extensions (chat: `return_input_ids_in_sglext` / `return_output_ids_in_sglext`;
text: `return_token_ids`, the prompt sent as ids). The T = 0 replies are written in the gpu-client step's format
to OUT, for `python -m benchmarks greedy-check MODEL OUT` (every token the target's fp32 greedy choice):
greedy replies are judged by that check, not byte for byte (two greedy runs differ at bf16 near-ties, with or without
speculation). A request that names no temperature (the OpenAI default, 1) is served where T > 0 is, else refused
with HTTP 400 naming temperature; T > 0 replies get the same checks, not the greedy one.

  python -m benchmarks openai-check --url http://127.0.0.1:30000 --tokenizer MODEL_DIR --out openai.json

"As without speculation" is checked against the same check of the same target served without it: --problems-out
writes a run's problem lines, --against reads those of the run without speculation, and a problem found there too
(its line alike but for numbers: token counts follow the replies) is printed as SGLang's own, not failed (SGLang
0.5.23 drops the logprobs of a streamed chat reply's last chunk when a stop string cuts it, speculation or not).
Prints one line per request kind and `OPENAI_CHECK PASS|FAIL`; exit status 1 on FAIL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from typing import Callable

PROMPTS = (
    "Count from 1 to 30, separated by commas.",
    "Write a Python function that reverses a string, then explain it in two sentences.",
    "Name five rivers of Europe, one per line, with a sentence about each.",
)
STOP = [", 5", ". ", "\n\n"]  # one spans tokens (", 5"), one ends inside a token (". "), one is whitespace
IDS_CHAT = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
IDS_TEXT = {"return_token_ids": True}
# (name, request parameters) of every request kind; each runs for chat and text, streamed and not
CASES = (
    ("plain", {"max_tokens": 48}),
    ("max_tokens", {"max_tokens": 5}),
    ("stop", {"max_tokens": 96, "stop": STOP}),
    ("logprobs", {"max_tokens": 24, "stop": STOP, "logprobs": 3}),
    ("n", {"max_tokens": 24, "n": 2, "seed": 7}),
)


@dataclasses.dataclass
class Reply:
    """One choice of a response, assembled from its chunks when streamed."""

    text: str = ""
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    output_ids: list[int] | None = None
    logprobs: list[int] | None = None  # per completion token: how many alternatives came with it


@dataclasses.dataclass
class Response:
    replies: dict[int, Reply]
    completion_tokens: int | None  # usage
    input_ids: list[int] | None


def _ids(reply: Reply, ids) -> None:
    if ids is not None:
        reply.output_ids = (reply.output_ids or []) + list(ids)


def _logprobs(reply: Reply, counts: list[int]) -> None:
    reply.logprobs = (reply.logprobs or []) + counts


def assemble(api: str, payloads: list[dict]) -> Response:
    """A response from its JSON: one object, or a stream's chunks in order."""
    replies: dict[int, Reply] = {}
    usage, input_ids = None, None
    for payload in payloads:
        usage = payload.get("usage") or usage
        ext = payload.get("sglext") or {}
        input_ids = ext.get("input_ids") or input_ids
        for index, ids in enumerate(ext.get("output_ids") or []):
            replies.setdefault(index, Reply()).output_ids = list(ids)
        for choice in payload.get("choices") or []:
            reply = replies.setdefault(choice["index"], Reply())
            if api == "chat":
                part = choice.get("message") or choice.get("delta") or {}
                reply.text += part.get("content") or ""
                content = (choice.get("logprobs") or {}).get("content")
                if content is not None:
                    _logprobs(reply, [len(e.get("top_logprobs") or []) for e in content])
            else:
                reply.text += choice.get("text") or ""
                _ids(reply, choice.get("token_ids"))
                input_ids = choice.get("prompt_token_ids") or input_ids
                top = (choice.get("logprobs") or {}).get("top_logprobs")
                if top is not None:
                    _logprobs(reply, [len(t or {}) for t in top])
            reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
            if choice.get("matched_stop") is not None:
                reply.matched_stop = choice["matched_stop"]
    return Response(replies, None if usage is None else usage.get("completion_tokens"), input_ids)


def problems(params: dict, response: Response, decode: Callable[[list[int]], str]) -> list[str]:
    """What is wrong with `response` to a request of `params` (module docstring); [] when nothing is."""
    found = []
    n, stops, max_tokens = params.get("n", 1), params.get("stop") or [], params["max_tokens"]
    if sorted(response.replies) != list(range(n)):
        found.append(f"choices {sorted(response.replies)}, not 0..{n - 1}")
    for index, r in sorted(response.replies.items()):

        def say(what: str) -> None:
            found.append(f"choice {index}: {what}")

        if r.finish_reason not in ("stop", "length"):
            say(f"finish_reason {r.finish_reason!r}")
        if (r.finish_reason == "stop") != (r.matched_stop is not None):
            say(f"finish_reason {r.finish_reason!r} with matched_stop {r.matched_stop!r}")
        leaked = [s for s in stops if s in r.text]
        if leaked:
            say(f"the text holds the stop string {leaked[0]!r}: {r.text[-60:]!r}")
        if r.output_ids is None:
            say("no token ids came back (sglext output_ids / token_ids)")
            continue
        ids, count = r.output_ids, len(r.output_ids)
        if count > max_tokens or (r.finish_reason == "length" and count != max_tokens):
            say(f"{count} tokens for max_tokens {max_tokens}, finish_reason {r.finish_reason!r}")
        full = decode(ids)
        if isinstance(r.matched_stop, str):
            start = full.find(r.matched_stop)
            if r.matched_stop not in stops:
                say(f"matched_stop {r.matched_stop!r} was not asked for ({stops})")
            elif start < 0 or r.matched_stop in decode(ids[:-1]):
                say(f"the tokens {full[-60:]!r} complete the stop {r.matched_stop!r} before their last token, or not")
            elif r.text != full[:start]:
                say(f"text {r.text[-40:]!r} is not the tokens up to the stop {full[:start][-40:]!r}")
        else:
            if isinstance(r.matched_stop, int) and r.matched_stop in ids[:-1]:
                say(f"tokens follow the stop token {r.matched_stop}")
            if r.text != full:
                say(f"text {r.text[-40:]!r} is not its tokens decoded {full[-40:]!r}")
        if params.get("logprobs"):
            k = params["logprobs"]
            if r.logprobs is None or len(r.logprobs) != count or not all(1 <= m <= k for m in r.logprobs):
                shown = None if r.logprobs is None else (len(r.logprobs), sorted(set(r.logprobs)))
                say(f"logprobs {shown} (entries, alternatives) for {count} tokens, top_logprobs {k}")
    total = sum(len(r.output_ids or []) for r in response.replies.values())
    if response.completion_tokens is not None and response.completion_tokens != total:
        found.append(f"usage.completion_tokens {response.completion_tokens}, the choices hold {total} tokens")
    if response.completion_tokens is None:
        found.append("no usage")
    return found


def request(client, api: str, prompt_ids: list[int], text: str, params: dict, stream: bool, temperature) -> list[dict]:
    """One request through the openai client -> its JSON (the chunks of a stream)."""
    kwargs = dict(model="default", stream=stream, max_tokens=params["max_tokens"])
    for key in ("stop", "n", "seed"):
        if key in params:
            kwargs[key] = params[key]
    if temperature is not None:
        kwargs["temperature"] = temperature
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    if api == "chat":
        if params.get("logprobs"):
            kwargs.update(logprobs=True, top_logprobs=params["logprobs"])
        call = client.chat.completions.create(
            messages=[{"role": "user", "content": text}], extra_body=IDS_CHAT, **kwargs
        )
    else:
        if params.get("logprobs"):
            kwargs["logprobs"] = params["logprobs"]
        call = client.completions.create(prompt=prompt_ids, extra_body=IDS_TEXT, **kwargs)
    return [chunk.model_dump() for chunk in call] if stream else [call.model_dump()]


def serves_sampling(client) -> tuple[bool, str]:
    """Whether a chat request naming no temperature (the OpenAI default, 1) is served; a refusal must be HTTP 400
    naming temperature (LILICORR without flashinfer)."""
    import openai

    try:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        return True, "a request without a temperature is served (T > 0 verified by sampling)"
    except openai.BadRequestError as e:
        message = e.body.get("message", str(e)) if isinstance(e.body, dict) else str(e)
        if "temperature" not in message:
            raise
        return False, f"a request without a temperature is refused, HTTP 400: {' '.join(message.split())[:300]}"


def check(client, tokenizer) -> tuple[list[dict], list[str]]:
    """Every request kind at T = 0, and at T > 0 where the server serves it -> (the T = 0 records for the greedy
    check, the problems found)."""
    sampling, said = serves_sampling(client)
    print(said, flush=True)
    bad, records = [], []
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    for temperature in (0.0, 0.8) if sampling else (0.0,):
        for name, params in CASES:
            for api in ("chat", "text"):
                for stream in (False, True):
                    kind = f"T={temperature:g} {api} {'stream' if stream else 'whole'} {name}"
                    found, tokens = [], 0
                    for text in PROMPTS:
                        chat = tokenizer.apply_chat_template(
                            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
                        )
                        prompt_ids = list(tokenizer(chat, add_special_tokens=False)["input_ids"])
                        response = assemble(api, request(client, api, prompt_ids, text, params, stream, temperature))
                        found += [f"{text[:24]!r}: {p}" for p in problems(params, response, decode)]
                        input_ids = response.input_ids or prompt_ids
                        for reply in response.replies.values():
                            tokens += len(reply.output_ids or [])
                            if temperature == 0 and reply.output_ids:
                                records.append(record(kind, text, input_ids, reply, params))
                    print(f"{kind}: {tokens} tokens, {len(found)} problem(s)", flush=True)
                    bad += [f"{kind}: {p}" for p in found]
    return records, bad


def also_without_speculation(bad: list[str], baseline: list[str]) -> tuple[list[str], list[str]]:
    """`bad` split into (this server's own problems, those the server without speculation has too), lines compared
    with every number masked."""
    alike = lambda line: re.sub(r"\d+", "#", line)  # noqa: E731
    seen = {alike(line) for line in baseline}
    return [b for b in bad if alike(b) not in seen], [b for b in bad if alike(b) in seen]


def record(kind: str, prompt: str, input_ids: list[int], reply: Reply, params: dict) -> dict:
    """A reply in the gpu-client step's record format (what the greedy-check step reads)."""
    return {
        "phase": f"openai {kind}",
        "prompt": prompt,
        "input_ids": input_ids,
        "sampling": {"temperature": 0, **{k: v for k, v in params.items() if k != "logprobs"}},
        "text": reply.text,
        "output_ids": reply.output_ids,
        "meta": {"finish_reason": reply.finish_reason, "matched_stop": reply.matched_stop},
        "error": None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--tokenizer", required=True, help="the target's folder (its tokenizer and chat template)")
    p.add_argument("--out", required=True, help="JSON file for the T = 0 records (the greedy check reads it)")
    p.add_argument("--problems-out", help="JSON file for the problem lines found (for --against)")
    p.add_argument("--against", help="the --problems-out file of this check on the same target without speculation")
    a = p.parse_args(argv)
    baseline = json.loads(open(a.against).read()) if a.against else []
    import openai
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=a.url.rstrip("/") + "/v1", api_key="none", timeout=300, max_retries=0)
    records, bad = check(client, AutoTokenizer.from_pretrained(a.tokenizer))
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)
    if a.problems_out:
        with open(a.problems_out, "w") as f:
            json.dump(bad, f, indent=1)
    print(f"{len(records)} greedy replies with token ids -> {a.out}")
    bad, shared = also_without_speculation(bad, baseline)
    for line in shared[:20]:
        print(f"  also without speculation: {line}")
    for line in bad[:20]:
        print(f"  {line}")
    print("OPENAI_CHECK", "FAIL" if bad else "PASS")
    return 1 if bad else 0
