"""Concurrent, resumable benchmark runs of (system, dataset, concurrency c, temperature, seed, max_tokens): c workers
play the prompts, a phase per category, each finished prompt one line appended to the results file; a rerun skips what
it holds and retries failures. Warm-up: max(warmup, c) unrecorded first turns in waves of c."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .. import ownership
from ..config import ConfigError, json_number
from ..errors import UsageError
from ..jsonl import loads
from .client import ID_LISTS, SPEC_LISTS, Sampling, ServerError, SGLangClient
from .metrics import ResultsError
from .prompt import Prompt

MAX_FAILURES = 20  # a run stops sending once this many prompts failed (server down, bad settings)


class RunFailed(ServerError):
    """Prompts of a run failed (exit 1); what was recorded stays, a rerun retries the rest."""


@dataclass(frozen=True)
class RunConfig:
    system: str
    dataset: str
    concurrency: int
    temperature: float
    seed: int
    max_tokens: int

    def __post_init__(self):
        for name, ok, what in (
            ("concurrency", self.concurrency >= 1, ">= 1"),
            ("temperature", self.temperature >= 0, ">= 0"),
            ("max_tokens", self.max_tokens >= 1, ">= 1"),
        ):
            if not ok:
                raise UsageError(
                    f"{getattr(self, name)} is out of range",
                    where=f"--{name.replace('_', '-')}",
                    fix=f"pass a value {what}",
                )

    @property
    def key(self) -> Tuple:
        return (self.system, self.dataset, self.concurrency, float(self.temperature), self.seed, self.max_tokens)


def record_key(record: dict) -> Tuple:
    """(RunConfig.key, prompt_id) of a results line."""
    return RunConfig(**{k: record[k] for k in RunConfig.__dataclass_fields__}).key, record["prompt_id"]


RECORD_FIELDS = dict(system=str, dataset=str, concurrency=int, temperature=float, seed=int, max_tokens=int)  # RunConfig
RECORD_FIELDS.update(prompt_id=str, category=str, turns=list)
FIX_LINE = "fix or remove that line"
TURN_FIELDS = {"completion_tokens": int, "start": float, "end": float}
TURN_LISTS = (*SPEC_LISTS, *ID_LISTS)  # lists of integers >= 0 a turn holds where the server sent them


def _is(value, kind: type) -> bool:
    """A JSON value of `kind`; numbers as config.json_number reads them (an int is a float too, a bool neither)."""
    if kind not in (int, float):
        return isinstance(value, kind)
    try:
        json_number(value, kind, "")
    except ConfigError:
        return False
    return True


def check_record(record, where: str) -> dict:
    """A results line as `run` writes it: the run's config, prompt_id, category and non-empty turns with token
    counts and times (and, where present, TURN_LISTS as lists of integers >= 0); else ResultsError naming the field."""
    if not isinstance(record, dict):
        raise ResultsError(
            f"a results line must be a JSON object, got {type(record).__name__}",
            where=where,
            fix="results files are written by `lilicorr bench run`",
        )
    for name, kind in RECORD_FIELDS.items():
        if not _is(record.get(name), kind):
            raise ResultsError(f"`{name}`={record.get(name)!r:.60} is not a {kind.__name__}", where=where, fix=FIX_LINE)
    try:
        record_key(record)
    except ValueError as e:
        raise ResultsError(str(e), where=where, fix=FIX_LINE) from e
    if not record["turns"]:
        raise ResultsError("`turns` is empty", where=where, fix=FIX_LINE)
    for i, turn in enumerate(record["turns"]):
        bad = [n for n, kind in TURN_FIELDS.items() if not (isinstance(turn, dict) and _is(turn.get(n), kind))]
        if not bad and turn.get("spec_verify_ct") is not None and not _is(turn["spec_verify_ct"], int):
            bad = ["spec_verify_ct"]
        if not bad:
            bad = [n for n in TURN_LISTS if n in turn and not _counts(turn[n])]
        if bad or turn["end"] < turn["start"] or turn["completion_tokens"] < 0:
            raise ResultsError(
                f"turns[{i}] needs completion_tokens >= 0, start <= end, an integer or null spec_verify_ct and "
                f"{' / '.join(TURN_LISTS)} as lists of integers >= 0 where present "
                f"(bad: {bad or ['start/end' if turn['end'] < turn['start'] else 'completion_tokens']})",
                where=where,
                fix=FIX_LINE,
            )
    return record


def _counts(value) -> bool:
    """A list of integers >= 0 (a histogram, token ids); JSON integers only, as `run` writes them."""
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _json_line(line: bytes, where: str):
    try:
        return loads(line.decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, too many digits, too deep, a lone surrogate
        raise ResultsError(f"not valid JSON ({e})", where=where, fix=FIX_LINE) from e


def _torn_tail(data: bytes) -> Optional[int]:
    """Where a results file's torn last line starts (no newline, not JSON: a run stopped mid-write), or None."""
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    try:
        _json_line(data[cut:], "")
    except ResultsError:
        return cut
    return None


def read_results(path: Path) -> List[dict]:
    """Every record of a results file, checked (a duplicate measurement: ResultsError); a torn last line skipped."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ResultsError(
            f"cannot read the results file ({e.strerror or e})",
            where=str(path),
            fix="pass a .jsonl written by `lilicorr bench run`",
        ) from e
    cut = _torn_tail(data)
    if cut is not None:
        lineno = data[:cut].count(b"\n") + 1
        print(
            f"warning: {path}:{lineno} is a torn last line (no newline, not JSON: a run stopped mid-write); it is left "
            "out. `lilicorr bench run` with the same --results cuts it and reruns that prompt.",
            file=sys.stderr,
        )
        data = data[:cut]
    records, first = [], {}
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        record = check_record(_json_line(line, f"{path}:{n}"), f"{path}:{n}")
        key = record_key(record)
        if key in first:
            (system, dataset, c, t, seed, _), prompt_id = key
            raise ResultsError(
                f"prompt {prompt_id!r} of {system} on {dataset} (c={c}, T={t:g}, seed={seed}) is recorded twice, "
                f"first at line {first[key]}",
                where=f"{path}:{n}",
                fix="keep one of the two lines: a results file holds each measurement once",
            )
        first[key] = n
        records.append(record)
    return records


RESULTS = "a results file of `lilicorr bench run`"


def is_record(value) -> bool:
    try:
        check_record(value, "")
    except ResultsError:
        return False
    return True


def check_results_file(path: Path) -> Optional[int]:
    """--results must be missing, empty or a results file; reads only -> where a torn last line starts, or None."""
    return ownership.jsonl_for_append(path, is_record, RESULTS, "--results", ResultsError)


def open_for_append(path: Path):
    """A run's results file, checked, opened to append (a torn last line cut with a warning, a newline added)."""
    return ownership.open_for_append(path, check_results_file(path), RESULTS)


def phases(prompts: Sequence[Prompt]) -> List[Tuple[str, List[Prompt]]]:
    """Prompts grouped by category, categories in sorted order."""
    groups: Dict[str, List[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    return sorted(groups.items())


async def play(client: SGLangClient, prompt: Prompt) -> List[dict]:
    """Plays one conversation; returns the per-turn stats and replies."""
    messages, turns = [], []
    for user_turn in prompt.turns:
        messages.append({"role": "user", "content": user_turn})
        r = await client.turn(messages)
        messages.append({"role": "assistant", "content": r.text})
        stats = dict(completion_tokens=r.completion_tokens, spec_verify_ct=r.spec_verify_ct, start=r.start, end=r.end)
        turns.append({**stats, "text": r.text, **r.extras})
    return turns


@dataclass
class RunOutcome:
    done: int = 0
    skipped: int = 0
    failures: List[Tuple[str, str]] = field(default_factory=list)  # (prompt_id, error)


async def _run_phase(client, prompts, config, out, outcome, progress, max_failures):
    import aiohttp

    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)

    async def worker():
        while not queue.empty() and len(outcome.failures) < max_failures:
            prompt = queue.get_nowait()
            try:
                turns = await play(client, prompt)
            except aiohttp.ClientConnectorError as e:  # nothing listens there: the run ends, in one line
                raise ServerError(
                    f"no server answers ({e})", where=client.endpoint, fix="start the server, or check --url"
                ) from e
            except Exception as e:  # recorded, retried on resume
                outcome.failures.append((prompt.prompt_id, f"{type(e).__name__}: {e}"))
                continue
            record = {**asdict(config), "prompt_id": prompt.prompt_id, "category": prompt.category, "turns": turns}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            outcome.done += 1
            if progress is not None:
                progress.update(1)

    await asyncio.gather(*(worker() for _ in range(min(config.concurrency, len(prompts)))))


def warmup_waves(prompts: Sequence[Prompt], warmup: int, concurrency: int) -> List[List[Prompt]]:
    """A run's warm-up waves: ceil(max(warmup, c) / c) waves of c prompts (cycled); [] if warmup = 0."""
    if warmup <= 0 or not prompts:
        return []
    n_waves = -(-max(warmup, concurrency) // concurrency)
    cycled = [prompts[i % len(prompts)] for i in range(n_waves * concurrency)]
    return [cycled[w * concurrency : (w + 1) * concurrency] for w in range(n_waves)]


async def _warm_up(client: SGLangClient, waves: List[List[Prompt]], url: str) -> None:
    """Sends each wave's first turns concurrently, one wave after another; nothing is recorded."""
    import aiohttp

    for wave in waves:
        answers = await asyncio.gather(
            *(client.turn([{"role": "user", "content": p.turns[0]}]) for p in wave), return_exceptions=True
        )
        for e in answers:
            if isinstance(e, (aiohttp.ClientError, asyncio.TimeoutError)):
                raise ServerError(
                    f"a warm-up request failed ({type(e).__name__}: {e})",
                    where=url,
                    fix="start the server, or check --url",
                ) from e
            if isinstance(e, BaseException) and not isinstance(e, ServerError):  # a refused prompt: measured later
                raise e


async def run_async(
    prompts: Sequence[Prompt],
    config: RunConfig,
    url: str,
    results_path: Path,
    sampling: Sampling,
    api: str = "chat",
    model: str = "default",
    warmup: int = 0,
    show_progress: bool = True,
    request_timeout: float = 3600.0,
    max_failures: int = MAX_FAILURES,
    record_ids: bool = False,
) -> RunOutcome:
    """Runs the prompts of `config` not yet in results_path (after warm-up), one line per finished prompt."""
    import aiohttp

    results_path = Path(results_path)
    open_for_append(results_path).close()  # the file exists, whole lines only
    done_ids: Set[str] = {pid for key, pid in map(record_key, read_results(results_path)) if key == config.key}
    todo = [p for p in prompts if p.prompt_id not in done_ids]
    outcome = RunOutcome(skipped=len(prompts) - len(todo))
    if not todo:
        return outcome
    progress = None
    if show_progress:
        from tqdm.auto import tqdm

        label = f"{config.system} {config.dataset} c={config.concurrency} T={config.temperature:g} seed={config.seed}"
        progress = tqdm(total=len(prompts), initial=outcome.skipped, desc=label, unit="prompt")
    timeout = aiohttp.ClientTimeout(total=None, sock_read=request_timeout)
    connector = aiohttp.TCPConnector(limit=config.concurrency)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            client = SGLangClient(session, url, sampling, api=api, model=model, record_ids=record_ids)
            await _warm_up(client, warmup_waves(todo, warmup, config.concurrency), url)
            with open_for_append(results_path) as out:
                for _, group in phases(todo):
                    await _run_phase(client, group, config, out, outcome, progress, max_failures)
    finally:
        if progress is not None:
            progress.close()
    return outcome


def run(*args, **kwargs) -> RunOutcome:
    """Synchronous wrapper of run_async."""
    return asyncio.run(run_async(*args, **kwargs))


def sweep_configs(
    system: str,
    datasets: Iterable[str],
    concurrencies: Sequence[int],
    temperatures: Sequence[float],
    seeds: Sequence[int],
    max_tokens: int,
) -> List[RunConfig]:
    """The runs of a sweep. Greedy decoding (T = 0) is deterministic, so it runs the first seed only."""
    configs = []
    for dataset in datasets:
        for t in temperatures:
            for seed in seeds[:1] if t == 0 else seeds:
                for c in concurrencies:
                    configs.append(RunConfig(system, dataset, c, float(t), seed, max_tokens))
    return configs
