"""Generation backends of `lilicorr regenerate` (token ids in and out): `SGLangServers` (launched, a GPU each, or by
URL) and `TransformersGenerator` (CPU, tests); `session()` yields `complete(prompt, sampling, seed)`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import AsyncContextManager, Awaitable, Callable, Mapping, NamedTuple, Protocol, Sequence


class EngineError(RuntimeError):
    """A generation server did not start or answered with an error."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One `sglang.launch_server` process: what it serves, where, with which extra arguments."""

    model_path: str
    port: int
    gpus: str  # CUDA_VISIBLE_DEVICES
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    name: str = ""  # names its log file (server-<name>.log); default its position


class Completion(NamedTuple):
    output_ids: list[int]
    finish_reason: str  # "stop" (an end-of-turn id was generated) or "length"


Complete = Callable[[Sequence[int], Sampling, int], Awaitable[Completion]]  # (prompt ids, sampling, seed) -> completion


class Generator(Protocol):
    capacity: int  # requests worth keeping in flight

    def session(self) -> AsyncContextManager[Complete]: ...


def finish_reason(output_ids: Sequence[int], stop_token_ids: Sequence[int]) -> str:
    return "stop" if output_ids and output_ids[-1] in stop_token_ids else "length"


class SGLangServers:
    """SGLang servers, launched here (`launch`, `start`) or reached by URL, and the requests to them."""

    def __init__(self, urls: Sequence[str], concurrency: int = 256, request_timeout: float = 600.0) -> None:
        if not urls:
            raise EngineError("no SGLang server URL given.")
        self.urls, self.concurrency, self.request_timeout = [u.rstrip("/") for u in urls], concurrency, request_timeout
        self.processes: list[subprocess.Popen] = []

    @classmethod
    def launch(
        cls,
        model_path: str,
        gpus: int,
        port0: int = 31000,
        server_args: Sequence[str] = (),
        log_dir: str | Path = ".",
        startup_timeout: float = 900.0,
        concurrency: int = 256,
    ) -> "SGLangServers":
        """Start one server per GPU (port port0 + i), wait for /health; `close()` (or `with`) stops them."""
        visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        ids = visible[:gpus] if len(visible) >= gpus else [str(i) for i in range(gpus)]
        specs = [
            ServerSpec(model_path, port0 + i, ids[i], ("--max-running-requests", str(concurrency), *server_args))
            for i in range(gpus)
        ]
        return cls.start(specs, log_dir, startup_timeout, concurrency, warm_first=True)

    @classmethod
    def start(
        cls,
        specs: Sequence["ServerSpec"],
        log_dir: str | Path = ".",
        startup_timeout: float = 900.0,
        concurrency: int = 256,
        launcher: Sequence[str] = (),
        warm_first: bool = False,
    ) -> "SGLangServers":
        """Start the servers `specs` describe, wait for /health (warm_first: the first alone, filling the JIT cache);
        `launcher` replaces `python -m sglang.launch_server` by a command serving $PORT (tests' stand-ins)."""
        servers = cls([f"http://127.0.0.1:{s.port}" for s in specs], concurrency)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for i, spec in enumerate(specs):
            if warm_first and i == 1:
                servers._wait_started(startup_timeout, log_dir)
            serve = ["--model-path", spec.model_path, "--host", "127.0.0.1", "--port", str(spec.port), *spec.args]
            cmd = list(launcher) or [sys.executable, "-m", "sglang.launch_server", *serve]
            server_env = dict(CUDA_VISIBLE_DEVICES=spec.gpus, PORT=str(spec.port), SERVER_ARGS=shlex.join(spec.args))
            env = dict(os.environ, **server_env, **spec.env)
            log = open(Path(log_dir) / f"server-{spec.name or i}.log", "w")
            # cwd: the log folder, never a checkout whose plain sglang_lilicorr/ would shadow the installed one
            process = subprocess.Popen(
                cmd, env=env, cwd=log_dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            servers.processes.append(process)
        servers._wait_started(startup_timeout, log_dir)
        return servers

    def _wait_started(self, timeout: float, log_dir) -> None:
        """Wait until the servers started so far answer; on failure stop them all."""
        try:
            self.wait_healthy(timeout, log_dir, upto=len(self.processes))
        except BaseException:
            self.close()
            raise

    def wait_healthy(self, timeout: float, log_dir: str | Path = ".", upto: int | None = None) -> None:
        end = time.time() + timeout
        pending = list(range(len(self.urls) if upto is None else upto))
        while pending:
            for i in list(pending):
                if self.processes and self.processes[i].poll() is not None:
                    raise EngineError(
                        f"SGLang server {self.urls[i]} exited during start-up (code {self.processes[i].returncode}); "
                        f"see its log in {log_dir}."
                    )
                try:
                    with urllib.request.urlopen(self.urls[i] + "/health", timeout=5) as r:
                        if r.status == 200:
                            pending.remove(i)
                except (urllib.error.URLError, OSError):
                    pass
            if pending and time.time() > end:
                raise EngineError(
                    f"SGLang servers {pending} not healthy after {timeout:.0f} s; see {log_dir}/server-*.log."
                )
            if pending:
                time.sleep(0.5)

    def close(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 15)
                except ProcessLookupError:
                    pass
        for p in self.processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        self.processes = []

    def __enter__(self) -> "SGLangServers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def capacity(self) -> int:
        return self.concurrency * len(self.urls)

    @contextlib.asynccontextmanager
    async def session(self):
        """`complete` for this event loop: requests round robin over the servers, `concurrency` in flight on each."""
        import aiohttp

        limits = [asyncio.Semaphore(self.concurrency) for _ in self.urls]
        turn = itertools.count()
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:

            async def complete(prompt: Sequence[int], sampling: Sampling, seed: int) -> Completion:
                i = next(turn) % len(self.urls)
                async with limits[i]:
                    return await self._post(http, self.urls[i], prompt, sampling, seed)

            yield complete

    async def _post(self, http, url: str, prompt: Sequence[int], sampling: Sampling, seed: int) -> Completion:
        import aiohttp

        params = {
            "temperature": sampling.temperature,
            "max_new_tokens": sampling.max_new_tokens,
            "stop_token_ids": list(sampling.stop_token_ids),
            "skip_special_tokens": False,
        }
        if sampling.temperature > 0:
            params.update(sampling_seed=int(seed), top_p=1.0, top_k=-1)
        body = {"input_ids": list(prompt), "sampling_params": params}
        for attempt in range(3):
            try:
                async with http.post(url + "/generate", json=body) as r:
                    text = await r.text()
                if r.status == 200:
                    ids = [int(t) for t in json.loads(text)["output_ids"]]
                    return Completion(ids, finish_reason(ids, sampling.stop_token_ids))
                detail = f"HTTP {r.status}: {text[:300]}"
            except (OSError, asyncio.TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError) as e:
                detail = f"{type(e).__name__}: {e}"
            await asyncio.sleep(1 + attempt)
        raise EngineError(f"{url}/generate failed three times: {detail}")


class TransformersGenerator:
    """Hugging Face generate, one request at a time (CPU, tests); at T > 0 under the request's seed."""

    capacity = 1

    def __init__(self, model, pad_token_id: int) -> None:
        self.model, self.pad = model, pad_token_id

    @contextlib.asynccontextmanager
    async def session(self):
        async def complete(prompt: Sequence[int], sampling: Sampling, seed: int) -> Completion:
            return self._generate(prompt, sampling, seed)

        yield complete

    def _generate(self, prompt: Sequence[int], sampling: Sampling, seed: int) -> Completion:
        import torch

        x = torch.tensor([list(prompt)], device=self.model.device)
        kwargs = dict(do_sample=False)
        if sampling.temperature > 0:
            torch.manual_seed(int(seed))
            kwargs = dict(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0)
        with torch.no_grad():
            y = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=self.pad,
                eos_token_id=list(sampling.stop_token_ids),
                **kwargs,
            )
        row = y[0, x.shape[1] :].tolist()
        ends = [i for i, t in enumerate(row) if t in sampling.stop_token_ids]
        ids = row[: ends[0] + 1] if ends else row
        return Completion(ids, finish_reason(ids, sampling.stop_token_ids))
