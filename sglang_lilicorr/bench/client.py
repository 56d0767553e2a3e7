"""One conversation turn against an SGLang server -> TurnResult, by `chat` (/v1/chat/completions), `generate` (/generate
with text, base models) or `ids` (/generate with UTF-8 bytes as input_ids, --skip-tokenizer-init, single-turn):
completion tokens, verify blocks, `Reply.extras` (SGLang's SPEC_LISTS; with `record_ids`, chat only, the token ids)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional

from ..errors import LiLiCorrError

API_PATHS = {"chat": "/v1/chat/completions", "generate": "/generate", "ids": "/generate"}


class ServerError(LiLiCorrError, RuntimeError):
    """The server answered with an error status or an unexpected body."""


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings; seed is sent as `seed` (chat) / `sampling_seed` (generate)."""

    temperature: float = 0.0
    max_tokens: int = 1024
    seed: Optional[int] = None
    ignore_eos: bool = False
    chat_template_kwargs: dict = field(default_factory=dict)


# per-request lists SGLang reports beside spec_verify_ct, index = accepted drafts / verified width (tokens verified per
# request: LILICORR's verify width), each count a verify step; absent (meta_info) or empty (the OpenAI API) when none
SPEC_LISTS = ("spec_correct_drafts_histogram", "spec_cap_lens_histogram")
ID_LISTS = ("input_ids", "output_ids")  # the chat API's sglext token ids, asked with record_ids


class Reply(NamedTuple):
    """A response: text, completion tokens, verify blocks (None without spec stats), the lists a turn records."""

    text: str
    completion_tokens: int
    spec_verify_ct: Optional[int]
    extras: Dict[str, List[int]]


@dataclass(frozen=True)
class TurnResult:
    text: str
    completion_tokens: int
    spec_verify_ct: Optional[int]  # verification blocks; None when the server reported no spec stats
    start: float  # wall clock (time.time()) when the request was sent
    end: float  # start + measured latency
    extras: Dict[str, List[int]] = field(default_factory=dict)  # Reply.extras


def chat_body(messages: List[dict], sampling: Sampling, model: str, record_ids: bool = False) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "temperature": sampling.temperature,
        "max_completion_tokens": sampling.max_tokens,
        "ignore_eos": sampling.ignore_eos,
        "return_spec_tokens_details": True,
        "stream": False,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.chat_template_kwargs:
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    if record_ids:
        body.update(return_input_ids_in_sglext=True, return_output_ids_in_sglext=True)
    return body


def sampling_params(sampling: Sampling) -> dict:
    """/generate's `sampling_params`."""
    params = dict(temperature=sampling.temperature, max_new_tokens=sampling.max_tokens, ignore_eos=sampling.ignore_eos)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return params


def generate_body(messages: List[dict], sampling: Sampling) -> dict:
    return {"text": "\n\n".join(m["content"] for m in messages), "sampling_params": sampling_params(sampling)}


def ids_body(messages: List[dict], sampling: Sampling) -> dict:
    """A single-turn prompt as token ids: its UTF-8 bytes."""
    if len(messages) != 1:
        raise ValueError(
            "api 'ids' plays single-turn prompts only (no tokenizer renders a reply into the next turn); "
            f"got {len(messages)} messages."
        )
    return {"input_ids": list(messages[0]["content"].encode("utf-8")), "sampling_params": sampling_params(sampling)}


def _verify_ct(stats: Optional[dict]) -> Optional[int]:
    ct = (stats or {}).get("spec_verify_ct")
    return int(ct) if ct else None


def _spec_lists(stats: Optional[dict]) -> Dict[str, List[int]]:
    """The non-empty SPEC_LISTS of a response's spec stats (where there were verify blocks)."""
    stats = stats or {}
    return {k: list(stats[k]) for k in SPEC_LISTS if _verify_ct(stats) and isinstance(stats.get(k), list) and stats[k]}


def parse_chat(payload: dict) -> Reply:
    """The Reply of a /v1/chat/completions response (token ids where sglext carries them: record_ids)."""
    try:
        text = payload["choices"][0]["message"].get("content") or ""
        tokens = int(payload["usage"]["completion_tokens"])
    except (KeyError, IndexError, TypeError) as e:
        raise ServerError(
            f"chat response lacks choices[0].message or usage.completion_tokens: {str(payload)[:200]}"
        ) from e
    ext = payload.get("sglext") or {}
    details = ext.get("spec_tokens_details")
    if isinstance(details, list):  # n > 1; we always send n = 1
        details = details[0] if details else None
    extras = _spec_lists(details)
    inputs, outputs = ext.get("input_ids"), ext.get("output_ids")
    if isinstance(inputs, list) and isinstance(outputs, list) and outputs and isinstance(outputs[0], list):
        extras.update(input_ids=list(inputs), output_ids=list(outputs[0]))  # output_ids: one list a choice
    return Reply(text, tokens, _verify_ct(details), extras)


def parse_generate(payload: dict, text_field: str = "text") -> Reply:
    """The Reply of a /generate response; the text is `text_field`."""
    if isinstance(payload, list):
        payload = payload[0]
    try:
        meta = payload["meta_info"]
        return Reply(str(payload[text_field]), int(meta["completion_tokens"]), _verify_ct(meta), _spec_lists(meta))
    except (KeyError, TypeError) as e:
        raise ServerError(
            f"/generate response lacks {text_field} or meta_info.completion_tokens: {str(payload)[:200]}"
        ) from e


class SGLangClient:
    """Sends one turn (the conversation so far) and times it; record_ids (chat): also the token ids."""

    def __init__(
        self, session, url: str, sampling: Sampling, api: str = "chat", model: str = "default", record_ids: bool = False
    ):
        if api not in API_PATHS:
            raise ValueError(f"api must be one of {sorted(API_PATHS)}, got {api!r}.")
        if record_ids and api != "chat":
            raise ValueError(f"record_ids asks the chat API for token ids; api {api!r} has no such option.")
        self.session, self.sampling, self.api, self.model, self.record_ids = session, sampling, api, model, record_ids
        self.endpoint = url.rstrip("/") + API_PATHS[api]

    def request(self, messages: List[dict]) -> tuple:
        """(request body, response parser) of one turn."""
        if self.api == "chat":
            return chat_body(messages, self.sampling, self.model, self.record_ids), parse_chat
        if self.api == "ids":
            return ids_body(messages, self.sampling), lambda payload: parse_generate(payload, "output_ids")
        return generate_body(messages, self.sampling), parse_generate

    async def turn(self, messages: List[dict]) -> TurnResult:
        body, parse = self.request(messages)
        start, t0 = time.time(), time.perf_counter()
        async with self.session.post(self.endpoint, json=body) as resp:
            raw = await resp.text()
        latency = time.perf_counter() - t0
        if resp.status != 200:
            raise ServerError(f"{self.endpoint} answered HTTP {resp.status}: {raw[:300]}")
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ServerError(f"{self.endpoint} answered non-JSON: {raw[:200]}") from e
        reply = parse(payload)
        return TurnResult(
            reply.text, reply.completion_tokens, reply.spec_verify_ct, start, start + latency, reply.extras
        )
