"""`lilicorr regenerate`: conversations whose every assistant turn is the target's own output. `play` answers a prompt
file's user turns; `build_dataset` is the recipe (Magpie and package prompts, deduplicated, evaluation prompts excluded,
a seeded second turn, replies cut where they loop, a held-out split, a manifest). Rows {"id", "source", "messages",
"turns": [{"prompt_ids", "output_ids", "finish_reason"}], "temperature", "seed"} are appended as finished, so a run
resumes; train.jsonl, heldout.jsonl and manifest.json are replaced whole."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import random
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..jsonl import loads
from ..ownership import claim_folder, jsonl_for_append, open_for_append, write_atomic
from .data import DataError, checked_messages, read_jsonl
from .engine import Completion, Generator, Sampling
from .loops import Loop, LoopRule, find_loop
from .prompts import PACKAGE_SOURCES, STEERING, EvalGuard, dedup_and_guard, end_of_turn_ids, eval_guard, normalised
from .prompts import package_prompts, steering_plan, user_texts, user_turn_prefix


@dataclasses.dataclass(frozen=True)
class Magpie:
    """A user turn the target writes itself, under `system` (None: the template's own prompt)."""

    system: str | None = None


UserTurn = str | Magpie


@dataclasses.dataclass
class Plan:
    """A conversation to play: its user turns, given or to be written, and fields copied to its row."""

    id: str
    source: str
    user_turns: list[UserTurn]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Settings:
    temperature: float = 0.0  # replies
    max_new_tokens: int = 512  # per reply
    user_max_new_tokens: int = 160  # per self-written user turn (T = 1)
    seed: int = 0
    chat_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    loops: LoopRule | None = None  # replies in pieces, cut where they loop (the recipe); None: one request, kept whole
    context_tokens: int = 0  # the servers' context length: a request asks for no more than fits (0: no limit)


@dataclasses.dataclass
class Stats:
    """What a run generated and dropped, for the manifest."""

    generated_tokens: int = 0
    generate_seconds: float = 0.0  # wall time of the generation (requests overlap)
    unplayed: int = 0  # plans not started because the run's time ran out (a later run plays them)
    loop_tokens: int = 0  # tokens generated past the cuts of looping replies (what the pieces could not save)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def request_seed(seed: int, conversation: str, turn: int, role: str) -> int:
    """A request's sampling seed, fixed by the run seed and the request's place (resume-stable)."""
    return zlib.crc32(f"{seed}:{conversation}:{turn}:{role}".encode()) & 0x7FFFFFFF


ROWS = "a file of `lilicorr regenerate` rows"


def is_row(value) -> bool:
    """A regenerate output line: a conversation ({"id", "messages", "turns"}) or a dropped one ({"id", "reason"})."""
    if not isinstance(value, dict) or "id" not in value:
        return False
    conversation = isinstance(value.get("turns"), list) and isinstance(value.get("messages"), list)
    return conversation or isinstance(value.get("reason"), str)


def check_rows_file(path: Path) -> int | None:
    """`path` (and its `.dropped`) must be new, empty or of regenerated rows; reads only -> a torn tail's offset."""
    jsonl_for_append(path.with_name(path.name + ".dropped"), is_row, ROWS, "--output", DataError)
    return jsonl_for_append(path, is_row, ROWS, "--output", DataError)


def is_recipe_dir(folder: Path) -> bool:
    """A data set the recipe wrote before data sets carried a marker: its manifest names the recipe."""
    try:
        return "recipe" in loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def claim_dataset_dir(folder: Path, create: bool = True) -> None:
    fix = "pick a new or empty folder, or a data set of the recipe to resume it (regenerate writes nowhere else)"
    claim_folder(folder, "dataset", "--output-dir", recognise=is_recipe_dir, create=create, fix=fix)


def done_ids(path: Path) -> set[str]:
    """Ids already written (the file checked to be ours first); a torn last line (interrupted write) is cut off."""
    if not path.exists():
        return set()
    open_for_append(path, jsonl_for_append(path, is_row, ROWS, "--output", DataError), ROWS).close()
    return {str(row["id"]) for _, row in read_jsonl(path)}


def play(
    plans: Sequence[Plan],
    output: Path,
    tokenizer,
    generator: Generator,
    settings: Settings,
    guard: EvalGuard | None = None,
    seen: set[str] | None = None,
    stats: Stats | None = None,
    until: float | None = None,
) -> Stats:
    """Play every plan not yet in `output` (or `.dropped`), `generator.capacity` at once, each appended when done. A
    self-written user turn cut off, duplicate or overlapping `guard` ends its conversation; past `until` none starts."""
    stats = stats or Stats()
    output.parent.mkdir(parents=True, exist_ok=True)
    dropped_path = output.with_name(output.name + ".dropped")
    done = done_ids(output) | done_ids(dropped_path)
    todo = [p for p in plans if p.id not in done]
    stops = tuple(end_of_turn_ids(tokenizer))
    reply = Sampling(settings.temperature, settings.max_new_tokens, stops)
    user = Sampling(1.0, settings.user_max_new_tokens, stops)
    conversation = Conversation(tokenizer, reply, user, settings, guard, seen, stats)
    t0 = time.perf_counter()
    with RowWriter(output) as rows, RowWriter(dropped_path) as dropped:
        asyncio.run(_play_all(todo, conversation, generator, rows, dropped, until))
    stats.generate_seconds += time.perf_counter() - t0
    return stats


async def _play_all(
    todo: Sequence[Plan], conversation: "Conversation", generator: Generator, rows, dropped, until: float | None
) -> None:
    from tqdm.auto import tqdm

    slots = asyncio.Semaphore(generator.capacity)
    with tqdm(total=len(todo), desc=f"regenerate {rows.path.name}", dynamic_ncols=True) as bar:
        async with generator.session() as complete:

            async def one(plan: Plan) -> None:
                async with slots:
                    if until is not None and time.time() > until:
                        conversation.stats.unplayed += 1
                        return
                    row, lost = await conversation.play(plan, complete)
                (rows if row else dropped).add(row or lost)
                bar.update(1)

            await asyncio.gather(*(one(p) for p in todo))


class RowWriter:
    """Appends JSON rows to a file, flushed to disk every `every` rows and at the end."""

    def __init__(self, path: Path, every: int = 256) -> None:
        self.path, self.every, self.pending = path, every, 0

    def __enter__(self) -> "RowWriter":
        self.f = open_for_append(self.path, jsonl_for_append(self.path, is_row, ROWS, "--output", DataError), ROWS)
        return self

    def add(self, row: Mapping[str, Any]) -> None:
        self.f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.pending += 1
        if self.pending >= self.every:
            self.sync()

    def sync(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.pending = 0

    def __exit__(self, *exc) -> None:
        self.sync()
        self.f.close()


@dataclasses.dataclass
class Conversation:
    """How one plan is played: its user turns (given, or self-written at T = 1) each answered by the target."""

    tokenizer: Any
    reply: Sampling
    user: Sampling
    settings: Settings
    guard: EvalGuard | None
    seen: set[str] | None
    stats: Stats

    async def play(self, plan: Plan, complete) -> tuple[dict | None, dict | None]:
        """-> (its row, None), or (None, why it was dropped) when no turn was answered."""
        tok, settings = self.tokenizer, self.settings
        row = {
            "id": plan.id,
            "source": plan.source,
            **plan.meta,
            "messages": [],
            "turns": [],
            "temperature": settings.temperature,
            "seed": settings.seed,
        }
        for t, turn in enumerate(plan.user_turns):
            if isinstance(turn, Magpie):
                prefix = tok(user_turn_prefix(tok, row["messages"], turn.system), add_special_tokens=False)["input_ids"]
                out = await self._complete(complete, prefix, self.user, request_seed(settings.seed, plan.id, t, "user"))
                text, reason = tok.decode(out.output_ids, skip_special_tokens=True).strip(), None
                if out.finish_reason != "stop":
                    reason = "user_turn_cut_off"
                elif self.seen is not None:
                    kept, why = dedup_and_guard([text], self.guard or EvalGuard(set(), set()), self.seen)
                    reason = None if kept else f"user_turn_{next(k for k, v in why.items() if v)}"
                if reason is not None:
                    self.stats.drop(reason)
                    return (row, None) if row["turns"] else (None, {"id": plan.id, "reason": reason})
                turn = text
            row["messages"].append({"role": "user", "content": turn})
            template = dict(tokenize=True, return_dict=False, add_generation_prompt=True, **settings.chat_kwargs)
            prompt = list(tok.apply_chat_template(row["messages"], **template))
            out, loop = await self._reply(complete, prompt, request_seed(settings.seed, plan.id, t, "assistant"))
            left = len(plan.user_turns) - t - 1  # user turns after this one
            if loop is not None and loop.start < settings.loops.min_kept:  # a loop from the reply's first tokens
                self.stats.drop("reply_loops_from_start")
                if not row["turns"]:
                    return None, {"id": plan.id, "reason": "reply_loops_from_start"}
                row["messages"].pop()
                row["turns_skipped"] = left + 1
                return row, None
            reply = tok.decode(out.output_ids, skip_special_tokens=True)
            row["messages"].append({"role": "assistant", "content": reply})
            record = {"prompt_ids": prompt, "output_ids": out.output_ids, "finish_reason": out.finish_reason}
            if loop is not None:
                record["loop"] = {"period": loop.period, "repeats": round(loop.repeats, 2)}
            row["turns"].append(record)
            if settings.loops is not None and out.finish_reason != "stop" and left:
                row["turns_skipped"] = left  # a next user turn would answer a reply the target never finished
                return row, None
        return row, None

    async def _reply(self, complete, prompt: list[int], seed: int) -> tuple[Completion, Loop | None]:
        """The reply to `prompt` (capped by the context): one request, or with a loop rule pieces of `check_every`
        tokens -> (the reply, cut where a loop begins with finish_reason "loop"; the loop or None)."""
        rule, cap = self.settings.loops, self.reply.max_new_tokens
        if self.settings.context_tokens:
            cap = min(cap, self.settings.context_tokens - len(prompt) - 1)
        if rule is None:
            whole = dataclasses.replace(self.reply, max_new_tokens=cap)
            return await self._complete(complete, prompt, whole, seed), None
        ids: list[int] = []
        while len(ids) < cap:
            piece = dataclasses.replace(self.reply, max_new_tokens=min(rule.check_every, cap - len(ids)))
            out = await self._complete(complete, [*prompt, *ids], piece, (seed + 7919 * len(ids)) & 0x7FFFFFFF)
            ids += out.output_ids
            if out.finish_reason == "stop" or not out.output_ids:
                return Completion(ids, out.finish_reason), None
            loop = find_loop(ids, rule)
            if loop is not None:
                self.stats.loop_tokens += len(ids) - loop.start
                return Completion(ids[: loop.start], "loop"), loop
        return Completion(ids, "length"), None

    async def _complete(self, complete, prompt, sampling: Sampling, seed: int):
        if sampling.max_new_tokens < 1:  # the prompt fills the context: nothing can be asked
            return Completion([], "length")
        out = await complete(prompt, sampling, seed)
        self.stats.generated_tokens += len(out.output_ids)
        return out


def prompt_plans(path: str | Path, guard: EvalGuard | None = None) -> list[Plan]:
    """Plans of a prompt file (`messages`, `turns` or `text`; `id`, `set` kept); an evaluation overlap is refused."""
    plans, ids = [], set()
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        if "messages" in row:
            turns = [m["content"] for m in checked_messages(row, where) if m["role"] == "user"]
        else:
            turns = user_texts(row)
        if not turns or not all(t.strip() for t in turns):
            raise DataError(
                "no user turn to answer", where=where, fix="give `messages` with user messages, `turns` or `text`"
            )
        rid = str(row.get("id", f"line-{number}"))
        if rid in ids:
            raise DataError(f"duplicate id {rid!r}", where=where, fix="ids must be unique for resuming")
        hit = next((t for t in turns if guard is not None and guard.overlaps(t)), None)
        if hit is not None:
            raise DataError(
                f"this prompt equals an evaluation prompt or shares an 8-word shingle with one ({hit[:60]!r}...)",
                where=where,
                fix="remove it (training on evaluation prompts inflates tau)",
            )
        ids.add(rid)
        plans.append(Plan(rid, "file", turns, {"set": row["set"]} if isinstance(row.get("set"), str) else {}))
    if not plans:
        raise DataError("no prompt rows", where=str(path), fix='give one row a prompt: {"id", "messages" | "text"}')
    return plans


def recipe_plans(
    magpie: int,
    package: int,
    second_turn_share: float,
    seed: int,
    guard: EvalGuard,
    seen: set[str],
    package_sources: Sequence[str] = PACKAGE_SOURCES,
) -> tuple[list[Plan], dict]:
    """The recipe's conversation plans and what was dropped building them (package prompts guarded and deduplicated)."""
    prompts = package_prompts(package, seed, sources=package_sources)
    source_of = {text: source for source, text in reversed(prompts)}  # a text's first source
    texts, dropped = dedup_and_guard([text for _, text in prompts], guard, seen)
    plans = [Plan(f"package-{i}", "package", [t], {"package": source_of[t]}) for i, t in enumerate(texts)]
    plans += [Plan(f"magpie-{i}", "magpie", [Magpie(system)]) for i, system in enumerate(steering_plan(magpie, seed))]
    rng = random.Random(seed + 1)
    for p in plans:
        if rng.random() < second_turn_share:
            p.user_turns.append(Magpie())
    by_source = dict(Counter(source_of[t] for t in texts))
    return plans, {"package_prompts": {"kept": len(texts), **dropped, "by_source": by_source}}


def split_heldout(rows: list[dict], heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """A seeded choice of `heldout` conversations (by id) kept out of training."""
    held = {r["id"] for r in sorted(rows, key=lambda r: zlib.crc32(f"{seed}:{r['id']}".encode()))[:heldout]}
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


def file_entry(path: Path) -> dict:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"sha256": digest, "bytes": path.stat().st_size, "rows": sum(1 for _ in path.open(encoding="utf-8"))}


def recipe_options(args) -> dict:
    """build_dataset's sizes and deadline (from now) from --magpie, --package, --second-turns, --heldout, --minutes."""
    return dict(
        magpie=args.magpie,
        package=args.package,
        second_turn_share=args.second_turns,
        heldout=args.heldout,
        until=time.time() + 60 * args.minutes if args.minutes else None,
    )


def build_dataset(
    out_dir: str | Path,
    tokenizer,
    generator: Generator,
    settings: Settings,
    *,
    magpie: int,
    package: int,
    second_turn_share: float,
    heldout: int,
    exclude: str | Path,
    describe: Mapping[str, Any] = (),
    until: float | None = None,
    package_sources: Sequence[str] = PACKAGE_SOURCES,
) -> dict:
    """The recipe: DIR/conversations.jsonl (resumable) -> train.jsonl, heldout.jsonl, manifest.json; past `until` the
    set closes. Replies are cut where they loop (`settings.loops`, default LoopRule())."""
    settings = dataclasses.replace(settings, loops=settings.loops or LoopRule())
    out = Path(out_dir)
    claim_dataset_dir(out)
    guard = eval_guard(exclude)
    conversations = out / "conversations.jsonl"
    seen: set[str] = set()
    plans, prepared = recipe_plans(magpie, package, second_turn_share, settings.seed, guard, seen, package_sources)
    if conversations.exists():  # resuming: the user turns already written count as seen
        done_ids(conversations)
        for _, row in read_jsonl(conversations):
            seen.update(normalised(t) for t in user_texts(row))
    t0 = time.perf_counter()
    stats = play(plans, conversations, tokenizer, generator, settings, guard, seen, until=until)
    rows = [row for _, row in read_jsonl(conversations)]
    if not rows:
        raise DataError(
            "the recipe produced no conversation", where=str(conversations), fix=f"see {conversations}.dropped for why"
        )
    train, held = split_heldout(rows, heldout, settings.seed)
    for name, part in (("train.jsonl", train), ("heldout.jsonl", held)):
        write_atomic(out / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part))
    dropped_path = conversations.with_name(conversations.name + ".dropped")
    dropped = [row for _, row in read_jsonl(dropped_path)] if dropped_path.exists() else []
    manifest = {
        **dict(describe),
        "seed": settings.seed,
        "sampling": {
            "replies": {
                "temperature": settings.temperature,
                "max_new_tokens": settings.max_new_tokens,
                "context_tokens": settings.context_tokens,
                "loops": dataclasses.asdict(settings.loops),
            },
            "user_turns": {"temperature": 1.0, "max_new_tokens": settings.user_max_new_tokens},
        },
        "recipe": {
            "magpie": magpie,
            "package": package,
            "package_sources": list(package_sources),
            "second_turn_share": second_turn_share,
            "heldout": heldout,
            "exclude": str(exclude),
            "steering": [{"share": share, "system": system} for share, system in STEERING],
        },
        "prepared": prepared,
        "counts": conversation_counts(rows, dropped),
        "this_call": {
            "unplayed": stats.unplayed,
            "generated_tokens": stats.generated_tokens,
            "tokens_past_loop_cuts": stats.loop_tokens,
            "generate_seconds": round(stats.generate_seconds, 1),
            "tokens_per_s": round(stats.generated_tokens / max(stats.generate_seconds, 1e-9)),
            "wall_seconds": round(time.perf_counter() - t0, 1),
        },
        "files": {name: file_entry(out / name) for name in ("conversations.jsonl", "train.jsonl", "heldout.jsonl")},
    }
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


LOOP_PERIODS = ((1, 1), (2, 7), (8, 31), (32, 127), (128, 10**9))  # the manifest's buckets of loop periods
REPLY_LENGTHS = ((1, 512), (513, 1024), (1025, 2048), (2049, 10**9))  # ... and of reply lengths (tokens)


def buckets(values: list[int], edges) -> dict[str, int]:
    name = lambda lo, hi: f"{lo}" if lo == hi else f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}"
    return {name(lo, hi): sum(lo <= v <= hi for v in values) for lo, hi in edges}


def conversation_counts(rows: list[dict], dropped: list[dict]) -> dict:
    turns = [t for r in rows for t in r["turns"]]
    loops = [t["loop"] for t in turns if t["finish_reason"] == "loop"]
    return {
        "conversations": len(rows),
        "by_source": dict(Counter(r["source"] for r in rows)),
        "two_turn": sum(len(r["turns"]) > 1 for r in rows),
        "assistant_turns": len(turns),
        "reply_tokens": sum(len(t["output_ids"]) for t in turns),
        "prompt_tokens_last_turn": sum(len(r["turns"][-1]["prompt_ids"]) for r in rows),
        "replies_cut_at_max_new_tokens": sum(t["finish_reason"] == "length" for t in turns),
        "replies_cut_at_a_loop": len(loops),
        "loop_periods": buckets([lp["period"] for lp in loops], LOOP_PERIODS),
        "reply_lengths": buckets([len(t["output_ids"]) for t in turns], REPLY_LENGTHS),
        "user_turns_skipped_after_a_cut": sum(r.get("turns_skipped", 0) for r in rows),
        "dropped_conversations": dict(Counter(d["reason"] for d in dropped)),
    }
