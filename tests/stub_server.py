"""A stand-in for an SGLang server, for CPU tests of the benchmark harness.

Threaded http.server on 127.0.0.1 and a free port (or a given one: `serve_forever` makes it a
stand-in server process; `free_port_block` finds ports for several). It answers POST /v1/chat/completions and
POST /generate in the shape SGLang 0.5.23 uses: chat -> choices / usage / sglext.spec_tokens_details
(only when the request asks `return_spec_tokens_details`); generate (`text` or `input_ids`) -> text /
output_ids / meta_info.

Replies are deterministic: "reply <k> to <first words of the last user message>" padded to n tokens,
n = max_tokens with ignore_eos, else min(max_tokens, 8 + len(last message) % 13). A speculative stub
reports spec_verify_ct = ceil(n / accept) blocks and sleeps step_s per block; a plain (autoregressive)
stub sleeps step_s per token and reports no spec stats. Its verify steps (`_steps`) each accept accept - 1 drafts (the
last what is left), or with `widths` (a LILICORR stand-in: the verify width of step k is widths[k % len]) at most
width - 1; like SGLang it reports spec_correct_drafts_histogram (steps by accepted drafts) and, with widths,
spec_cap_lens_histogram (steps by width) and spec_cap_length: in meta_info where non-empty, in the chat API's
spec_tokens_details always (an empty list without). Every request is logged with the counts it
returned and its arrival / finish times (time.time()), and the peak number of requests in flight is kept.

Like SGLang it answers HTTP 400 to invalid sampling parameters (temperature < 0, top_p outside (0, 1],
min_p outside [0, 1]) and to prompt words + max tokens beyond context_len, streams a chat reply with
"stream": true (one server-sent event per word, then [DONE]; a client that hangs up is counted in
`aborted`), and answers GET /health, /v1/models (max_model_len) and /v1/loads (num_running_reqs,
num_waiting_reqs, num_used_tokens: prompt words + max tokens of each request in flight, kept after
it ends when it was aborted and leak_on_abort is set). POST /start_profile writes a small chrome trace into the
request's output_dir (`STUB_TRACE_STEP` per profiled step: a kernel, a graph launch and a Python frame).

POST /v1/completions, and a chat request asking for its token ids (`return_output_ids_in_sglext`), answer as SGLang's
OpenAI API does (`_openai`): the reply is OPENAI_REPLY's tokens of OPENAI_VOCAB (then EOS), cut at max_tokens or the
first stop string it completes, with finish_reason and matched_stop, logprobs with top_logprobs, n choices, usage,
the token ids (`sglext`, `token_ids`), streamed or whole. `leak_past_stop` returns two tokens past max_tokens or a
stop (what a speculative block must not do); `refuse_sampled` answers T > 0, and a request naming no temperature,
with HTTP 400 as LILICORR without flashinfer does.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# One profiled step of the stub's trace (microseconds): 400 us of kernels in a 1000 us step.
STUB_TRACE_STEP = [
    {"ph": "X", "cat": "kernel", "name": "stub_verify", "ts": 0, "dur": 300},
    {"ph": "X", "cat": "kernel", "name": "stub_draft", "ts": 500, "dur": 100},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 20},
    {"ph": "X", "cat": "python_function", "name": "worker.py(1): forward_batch_generation", "ts": 0, "dur": 900},
    {"ph": "X", "cat": "kernel", "name": "stub_accept", "ts": 900, "dur": 100},
]


# the stub's OpenAI replies: token ids into OPENAI_VOCAB (id 0 is EOS), "Hello, world. This is a test, 5 more words
# here" then "\n\n" and EOS
OPENAI_VOCAB = ["<eos>", "Hello", ",", " world", ".", " This", " is", " a", " test", " 5", " more", " words", " here"]
OPENAI_VOCAB += ["\n\n"]
OPENAI_REPLY = [1, 2, 3, 4, 5, 6, 7, 8, 2, 9, 10, 11, 12, 13, 0]


def openai_decode(ids) -> str:
    """OPENAI_VOCAB's text of `ids`, EOS left out (a tokenizer's decode with skip_special_tokens)."""
    return "".join(OPENAI_VOCAB[i] for i in ids if i != 0)


def write_stub_trace(path: Path, steps: int) -> None:
    events = [dict(e, ts=e["ts"] + 1000 * k) for k in range(steps) for e in STUB_TRACE_STEP]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = (
        256  # listen backlog: a wave of c = 32 connections at once must not be reset (the default is 5)
    )


class StubServer:
    def __init__(
        self,
        speculative: bool = True,
        accept: int = 4,
        step_s: float = 0.001,
        min_latency_s: float = 0.02,
        fail_first: int = 0,
        context_len: int = 4096,
        leak_on_abort: bool = False,
        port: int = 0,
        leak_past_stop: bool = False,
        refuse_sampled: bool = False,
        widths: tuple[int, ...] | None = None,
    ):
        self.leak_past_stop, self.refuse_sampled, self.widths = leak_past_stop, refuse_sampled, widths
        self.speculative, self.accept, self.step_s, self.min_latency_s = speculative, accept, step_s, min_latency_s
        self.fail_first = fail_first  # the first k requests answer HTTP 500
        self.context_len, self.leak_on_abort = context_len, leak_on_abort
        self.running, self.kv_used, self.aborted = 0, 0, 0
        # [{"path", "body", "completion_tokens", "spec_verify_ct", "text", "failed", "arrived", "finished"}], in finish
        # order
        self.log = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address
        return f"http://{host}:{port}"

    def __enter__(self):
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serves in this thread until the process is killed (a stand-in server process)."""
        self._httpd.serve_forever()

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()

    def _reply(self, last_user: str, max_tokens: int, ignore_eos: bool, k: int):
        n = max_tokens if ignore_eos else min(max_tokens, 8 + len(last_user) % 13)
        head = f"reply {k} to " + " ".join(last_user.split()[:3])
        words = (head.split() + [f"t{i}" for i in range(n)])[:n]
        blocks = len(self._steps(n)) if self.speculative else None
        return " ".join(words), n, blocks

    def _steps(self, n: int) -> list[tuple[int, int]]:
        """(width, accepted drafts) of each verify step of an n-token reply: step k verifies widths[k % len] tokens (a
        block of 2 * accept without widths) and accepts accept - 1 drafts, at most width - 1, the last step what is
        left."""
        widths, steps, done = self.widths or (2 * self.accept,), [], 0
        while done < n:
            width = widths[len(steps) % len(widths)]
            steps.append((width, min(self.accept - 1, width - 1, n - done - 1)))
            done += steps[-1][1] + 1
        return steps

    @staticmethod
    def _histogram(values: list[int]) -> list[int]:
        """Counts by value, index = value (SGLang's per-request histograms)."""
        out = [0] * (max(values) + 1)
        for v in values:
            out[v] += 1
        return out

    def _spec_details(self, n: int, blocks: int, chat: bool = True) -> dict:
        """The spec stats of an n-token reply: the chat API's spec_tokens_details (every field), or meta_info's (the
        lists and spec_cap_length only where non-empty)."""
        steps = self._steps(n)
        proposed = blocks * (self.accept * 2 - 1)
        details = {
            "spec_accept_rate": (n - blocks) / proposed,
            "spec_accept_length": n / blocks,
            "spec_num_correct_drafts": n - blocks,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": blocks,
            "spec_correct_drafts_histogram": self._histogram([a for _, a in steps]),
            "spec_cap_lens_histogram": self._histogram([w for w, _ in steps]) if self.widths else [],
            "spec_cap_length": sum(w for w, _ in steps) / blocks if self.widths else 0.0,
        }
        return details if chat else {k: v for k, v in details.items() if v or not k.startswith("spec_cap")}

    def _answer(self, path: str, body: dict):
        arrived = time.time()
        with self._lock:
            k = len(self.log)
            fail = k < self.fail_first
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if path == "/v1/chat/completions":
                last_user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                max_tokens = body.get("max_completion_tokens") or body.get("max_tokens", 16)
                text, n, blocks = self._reply(last_user, max_tokens, body.get("ignore_eos", False), k)
            elif path == "/generate":
                params = body.get("sampling_params", {})
                prompt = body["text"].split("\n\n")[-1] if "text" in body else f"ids {len(body['input_ids'])}"
                text, n, blocks = self._reply(
                    prompt, params.get("max_new_tokens", 16), params.get("ignore_eos", False), k
                )
            else:
                return 404, {"error": f"no route {path}"}
            time.sleep(max(self.min_latency_s, self.step_s * (blocks if self.speculative else n)))
            with self._lock:
                self.log.append(
                    {
                        "path": path,
                        "body": body,
                        "completion_tokens": n,
                        "spec_verify_ct": blocks,
                        "text": text,
                        "failed": fail,
                        "arrived": arrived,
                        "finished": time.time(),
                    }
                )
            if fail:
                return 500, {"object": "error", "message": "stub: injected failure"}
            if path == "/generate":
                meta = {
                    "id": f"req-{k}",
                    "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": self._prompt_tokens(body),
                    "completion_tokens": n,
                    "cached_tokens": 0,
                    "e2e_latency": 0.0,
                }
                if self.speculative:
                    meta.update(self._spec_details(n, blocks, chat=False))
                return 200, {"text": text, "output_ids": list(range(n)), "meta_info": meta}
            payload = {
                "id": f"req-{k}",
                "object": "chat.completion",
                "model": body.get("model", "default"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": sum(len(m["content"].split()) for m in body["messages"]),
                    "completion_tokens": n,
                    "total_tokens": n,
                },
            }
            if self.speculative and body.get("return_spec_tokens_details"):
                payload["sglext"] = {"spec_tokens_details": self._spec_details(n, blocks)}
            return 200, payload
        finally:
            with self._lock:
                self.in_flight -= 1

    def _openai_choice(self, body: dict) -> tuple[list[int], str, str, int | str]:
        """(token ids, text, finish_reason, matched_stop) of one choice: OPENAI_REPLY cut at max_tokens or at the
        first stop string it completes (its text ending where the stop begins)."""
        limit, stops = body.get("max_tokens", 16), body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        extra = 2 if self.leak_past_stop else 0
        for k in range(1, len(OPENAI_REPLY) + 1):
            ids = OPENAI_REPLY[:k]
            text = openai_decode(ids)
            hit = min(((text.find(s), s) for s in stops if s in text), default=None)
            if hit is not None:
                return OPENAI_REPLY[: k + extra], text[: hit[0]], "stop", hit[1]
            if ids[-1] == 0:
                return ids, text, "stop", 0
            if k == limit:
                return OPENAI_REPLY[: k + extra], openai_decode(OPENAI_REPLY[: k + extra]), "length", None
        raise AssertionError("OPENAI_REPLY ends with EOS")

    @staticmethod
    def _logprob_entries(ids: list[int], k: int) -> list[dict]:
        """A chat logprobs entry per token, with k alternatives."""
        return [
            {
                "token": OPENAI_VOCAB[i],
                "logprob": -0.5,
                "top_logprobs": [{"token": OPENAI_VOCAB[j], "logprob": -0.5 - j} for j in range(1, k + 1)],
            }
            for i in ids
        ]

    def _openai(self, path: str, body: dict) -> list[dict]:
        """The payloads of an OpenAI completion (chat, or text at /v1/completions): one, or a stream's chunks."""
        chat, stream = path == "/v1/chat/completions", body.get("stream", False)
        k = body.get("top_logprobs") if chat else body.get("logprobs")
        choices = [self._openai_choice(body) for _ in range(body.get("n", 1))]
        usage = {"prompt_tokens": 3, "completion_tokens": sum(len(c[0]) for c in choices)}
        with self._lock:
            self.log.append({"path": path, "body": body, "completion_tokens": usage["completion_tokens"]})
        ext = {"input_ids": [7, 7, 7], "output_ids": [c[0] for c in choices]}
        if chat and self.speculative and body.get("return_spec_tokens_details"):
            n = len(choices[0][0])
            ext["spec_tokens_details"] = self._spec_details(n, len(self._steps(n)))
        if not stream:
            out = []
            for index, (ids, text, finish, matched) in enumerate(choices):
                choice = {"index": index, "finish_reason": finish, "matched_stop": matched}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                    choice["logprobs"] = {"content": self._logprob_entries(ids, k)} if body.get("logprobs") else None
                else:
                    choice.update(text=text, token_ids=ids, prompt_token_ids=ext["input_ids"])
                    choice["logprobs"] = None if not k else self._text_logprobs(ids, k)
                out.append(choice)
            payload = {"id": "cmpl-stub", "object": "chat.completion" if chat else "text_completion", "created": 0}
            payload.update(model="default", choices=out, usage=usage, sglext=ext if chat else None)
            return [payload]
        chunks = []
        for index, (ids, text, finish, matched) in enumerate(choices):
            sent = 0
            for t in range(len(ids)):
                piece = text[sent : len(openai_decode(ids[: t + 1]))]
                sent += len(piece)
                last = t == len(ids) - 1
                choice = {"index": index, "finish_reason": finish if last else None}
                choice["matched_stop"] = matched if last else None
                if chat:
                    choice["delta"] = {"content": piece}
                    choice["logprobs"] = {"content": self._logprob_entries(ids[t : t + 1], k)} if k else None
                else:
                    choice.update(text=piece, token_ids=ids[t : t + 1])
                    choice["prompt_token_ids"] = ext["input_ids"] if t == 0 else None
                    choice["logprobs"] = None if not k else self._text_logprobs(ids[t : t + 1], k)
                chunks.append({"id": "cmpl-stub", "object": "chunk", "created": 0, "model": "default"})
                chunks[-1]["choices"] = [choice]
        tail = {"id": "cmpl-stub", "object": "chunk", "created": 0, "model": "default", "choices": []}
        if chat:
            chunks.append(dict(tail, sglext=ext))
        chunks.append(dict(tail, usage=usage))
        return chunks

    @staticmethod
    def _text_logprobs(ids: list[int], k: int) -> dict:
        """A text completion's logprobs of `ids`, with k alternatives each."""
        return {
            "tokens": [OPENAI_VOCAB[i] for i in ids],
            "token_logprobs": [-0.5] * len(ids),
            "top_logprobs": [{OPENAI_VOCAB[j]: -0.5 - j for j in range(1, k + 1)} for _ in ids],
            "text_offset": [0] * len(ids),
        }

    def _refusal(self, body: dict) -> str | None:
        """LILICORR's 400 without flashinfer for a sampled request (no temperature: the OpenAI default, 1)."""
        if self.refuse_sampled and body.get("temperature", 1.0) > 0:
            return (
                "LILICORR refuses temperature > 0 on this server: SGLang's DFlash sampling verification is "
                "unavailable (its kernel needs flashinfer). Install flashinfer, or send temperature 0."
            )
        return None

    def _rejection(self, body: dict):
        """SGLang's 400 for invalid sampling parameters or a request longer than the context; None if valid."""
        params = body.get("sampling_params", body)
        if (
            params.get("temperature", 0) < 0
            or not 0 < params.get("top_p", 1) <= 1
            or not 0 <= params.get("min_p", 0) <= 1
        ):
            return "invalid sampling parameters"
        if self._tokens(body) > self.context_len:
            return f"Requested token count exceeds the model's maximum context length of {self.context_len} tokens."
        return None

    @staticmethod
    def _prompt_tokens(body: dict) -> int:
        """Prompt words, or the number of input_ids."""
        if "input_ids" in body:
            return len(body["input_ids"])
        return len((body.get("text") or " ".join(m["content"] for m in body.get("messages", []))).split())

    @classmethod
    def _tokens(cls, body: dict) -> int:
        """Prompt tokens + max tokens: what a request holds in the KV pool."""
        params = body.get("sampling_params", body)
        return cls._prompt_tokens(body) + (
            params.get("max_new_tokens") or params.get("max_completion_tokens") or params.get("max_tokens") or 16
        )

    def _hold(self, body: dict, delta: int, kv: bool = True):
        """A request starts (delta 1) or ends (-1): the running count and, with kv, the KV tokens it holds."""
        with self._lock:
            self.running += delta
            self.kv_used += delta * self._tokens(body) * kv

    def _stream(self, handler, body: dict):
        """A chat reply as server-sent events, one word each; a hang-up counts in `aborted`."""
        last_user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        text, _, _ = self._reply(
            last_user, body.get("max_completion_tokens") or 16, body.get("ignore_eos", False), len(self.log)
        )
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        self._hold(body, 1)
        aborted = False
        try:
            for word in text.split():
                chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": word + " "}}]}
                handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                handler.wfile.flush()
                time.sleep(max(self.step_s, 0.005))
            handler.wfile.write(b"data: [DONE]\n\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            aborted = True
        with self._lock:
            self.aborted += aborted
        self._hold(body, -1, kv=not (aborted and self.leak_on_abort))

    def _stream_generate(self, handler, body: dict):
        """A /generate reply as server-sent events, one block (`accept` tokens, or one without speculation) each,
        meta_info.completion_tokens counting up as SGLang's does."""
        params = body.get("sampling_params", {})
        _, n, _ = self._reply(
            "stream", params.get("max_new_tokens", 16), params.get("ignore_eos", False), len(self.log)
        )
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        step = self.accept if self.speculative else 1
        for k in range(step, n + step, step):
            chunk = {"text": "w " * min(k, n), "meta_info": {"completion_tokens": min(k, n)}}
            handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            handler.wfile.flush()
            time.sleep(self.step_s)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
        with self._lock:
            self.log.append(
                {
                    "path": "/generate",
                    "body": body,
                    "completion_tokens": n,
                    "spec_verify_ct": None,
                    "text": "",
                    "failed": False,
                    "arrived": time.time(),
                    "finished": time.time(),
                }
            )

    def _loads(self) -> dict:
        with self._lock:
            return {
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": self.running,
                        "num_waiting_reqs": 0,
                        "num_used_tokens": self.kv_used,
                    }
                ]
            }

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                rejection = stub._rejection(body) or stub._refusal(body)
                if rejection:
                    return self.send_json(400, {"object": "error", "message": rejection})
                if self.path == "/v1/completions" or body.get("return_output_ids_in_sglext"):
                    payloads = stub._openai(self.path, body)
                    if not body.get("stream"):
                        return self.send_json(200, payloads[0])
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    for chunk in payloads:
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    return None
                if body.get("stream") and self.path == "/generate":
                    return stub._stream_generate(self, body)
                if body.get("stream"):
                    return stub._stream(self, body)
                if self.path == "/start_profile":
                    write_stub_trace(
                        Path(body["output_dir"]) / f"{body.get('profile_prefix', '')}-stub-TP-0.trace.json.gz",
                        body["num_steps"],
                    )
                    return self.send_json(200, {"success": True})
                stub._hold(body, 1)
                try:
                    self.send_json(*stub._answer(self.path, body))
                finally:
                    stub._hold(body, -1)

            def do_GET(self):
                pages = {
                    "/health": {},
                    "/v1/models": {"data": [{"id": "default", "max_model_len": stub.context_len}]},
                    "/v1/loads?include=core": stub._loads(),
                }
                self.send_json(
                    *((200, pages[self.path]) if self.path in pages else (404, {"error": f"no route {self.path}"}))
                )

            def send_json(self, status: int, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler


def free_port_block(n: int) -> int:
    """The first of n consecutive loopback ports that are free now (stand-in servers bind them), below the kernel's
    ephemeral range: a client's connection takes its local port from that range, and one that landed in the block
    would stop a stand-in server of a later phase from binding its port."""
    import random

    import pytest

    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, low - n)
        if all(_free(port + i) for i in range(n)):
            return port
    pytest.skip("no block of free ports")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux: ip_local_port_range; elsewhere IANA's 49152)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


NO_SERVER = "http://127.0.0.1:9"  # a loopback port where no server listens


def bench_run_argv(dataset, results, *extra, url=NO_SERVER, system="x") -> list[str]:
    """`lilicorr bench run` of `dataset` against the server at `url` into `results`, then `extra`."""
    return [
        "bench",
        "run",
        "--url",
        url,
        "--system",
        system,
        "--dataset",
        str(dataset),
        "--results",
        str(results),
        *extra,
    ]
