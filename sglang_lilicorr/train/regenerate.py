"""`lilicorr regenerate`: conversations whose every assistant turn is the target's own output (the
drafter then learns what the verifier will accept), and the data recipe that builds a training set.

Two modes, one driver (`play`):
  prompt file   rows {"id", "messages"}: the user turns are played in order, each answered by the
                target (earlier assistant turns are dropped: they are what is regenerated).
  recipe        `build_dataset`: user turns the target writes itself (Magpie, prompts.py) and
                prompts from the standard library; deduplicated, evaluation prompts excluded; a
                seeded share of conversations gets a second, self-written user turn; a held-out
                split; a manifest (counts, tokens, throughput, sha256 of every file).
Output rows: {"id", "source", "messages", "turns": [{"prompt_ids", "output_ids", "finish_reason"}],
"temperature", "seed"}: `messages` trains the drafter, `turns` holds the exact ids the target saw
and produced (what `reference.replay` replays). Files are appended a chunk of conversations at a
time, so an interrupted run resumes where it stopped (ids already written are skipped; a torn last
line is cut off; conversations dropped on the way are recorded too, and not redone).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .data import DataError, checked_messages, read_jsonl
from .engine import Generator, Sampling
from .prompts import STEERING, EvalGuard, normalised, dedup_and_guard, end_of_turn_ids, package_prompts, steering_plan, user_turn_prefix


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
    chunk: int = 4096  # conversations per write
    chat_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Stats:
    """What a run generated and dropped, for the manifest."""

    generated_tokens: int = 0
    generate_seconds: float = 0.0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def request_seed(seed: int, conversation: str, turn: int, role: str) -> int:
    """A request's sampling seed, fixed by the run seed and the request's place (resume-stable)."""
    return zlib.crc32(f"{seed}:{conversation}:{turn}:{role}".encode()) & 0x7FFFFFFF


# --- resumable jsonl output --------------------------------------------------------------------


def done_ids(path: Path) -> set[str]:
    """Ids already written; a torn last line (interrupted write) is cut off."""
    if not path.exists():
        return set()
    done, good_end = set(), 0
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            try:
                done.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                if line.endswith(b"\n"):
                    raise DataError(f"{path}:{number}: a complete line is not a regenerated row; move the file aside.") from None
                print(f"warning: {path}:{number}: a torn last line (an interrupted write) is dropped and regenerated.", file=sys.stderr)
                break
            good_end += len(line)
    if good_end != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_end)
    return done


def append_rows(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --- the driver ----------------------------------------------------------------------------------


def play(plans: Sequence[Plan], output: Path, tokenizer, generator: Generator, settings: Settings,
         guard: EvalGuard | None = None, seen: set[str] | None = None, stats: Stats | None = None) -> Stats:
    """Play every plan not yet in `output` (or its `.dropped` file), a chunk at a time. Self-written
    user turns that are cut off, duplicate (`seen`) or overlap `guard` end the conversation there
    (a conversation without a reply is dropped)."""
    stats = stats or Stats()
    output.parent.mkdir(parents=True, exist_ok=True)
    dropped_path = output.with_name(output.name + ".dropped")
    done = done_ids(output) | done_ids(dropped_path)
    todo = [p for p in plans if p.id not in done]
    stops = end_of_turn_ids(tokenizer)
    reply = Sampling(settings.temperature, settings.max_new_tokens, tuple(stops))
    user = Sampling(1.0, settings.user_max_new_tokens, tuple(stops))
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), desc=f"regenerate {output.name}", dynamic_ncols=True) as bar:
        for start in range(0, len(todo), settings.chunk):
            chunk = todo[start : start + settings.chunk]
            rows, lost = _play_chunk(chunk, tokenizer, generator, reply, user, settings, guard, seen, stats)
            append_rows(output, rows)
            append_rows(dropped_path, lost)
            bar.update(len(chunk))
    return stats


def _generate(generator: Generator, prompts: list[list[int]], sampling: Sampling, seeds: list[int], stats: Stats):
    t0 = time.perf_counter()
    outs = generator.generate(prompts, sampling, seeds) if prompts else []
    stats.generate_seconds += time.perf_counter() - t0
    stats.generated_tokens += sum(len(o.output_ids) for o in outs)
    return outs


def _play_chunk(chunk, tokenizer, generator, reply: Sampling, user: Sampling, settings: Settings, guard, seen, stats):
    rows = {p.id: {"id": p.id, "source": p.source, **p.meta, "messages": [], "turns": [], "temperature": settings.temperature,
                   "seed": settings.seed} for p in chunk}
    stopped: dict[str, str] = {}  # conversation -> why its next user turn could not be played
    no_guard = EvalGuard(set(), set())
    for t in range(max(len(p.user_turns) for p in chunk)):
        playing = [p for p in chunk if p.id not in stopped and t < len(p.user_turns)]
        # 1. user turns: given, or written by the target (T = 1, its own template's user prefix)
        written = [p for p in playing if isinstance(p.user_turns[t], Magpie)]
        prefixes = [tokenizer(user_turn_prefix(tokenizer, rows[p.id]["messages"], p.user_turns[t].system), add_special_tokens=False)["input_ids"]
                    for p in written]
        outs = _generate(generator, prefixes, user, [request_seed(settings.seed, p.id, t, "user") for p in written], stats)
        texts = {p.id: p.user_turns[t] for p in playing if isinstance(p.user_turns[t], str)}
        for p, out in zip(written, outs):
            text = tokenizer.decode(out.output_ids, skip_special_tokens=True).strip()
            reason = "user_turn_cut_off" if out.finish_reason != "stop" else None
            if reason is None and seen is not None:
                kept, why = dedup_and_guard([text], guard or no_guard, seen)
                reason = None if kept else f"user_turn_{next(k for k, v in why.items() if v)}"
            if reason is None:
                texts[p.id] = text
            else:
                stats.drop(reason)
                stopped[p.id] = reason
        # 2. the target's replies
        answering = [p for p in playing if p.id in texts]
        prompts = []
        for p in answering:
            rows[p.id]["messages"].append({"role": "user", "content": texts[p.id]})
            prompts.append(list(tokenizer.apply_chat_template(rows[p.id]["messages"], tokenize=True, return_dict=False,
                                                              add_generation_prompt=True, **settings.chat_kwargs)))
        seeds = [request_seed(settings.seed, p.id, t, "assistant") for p in answering]
        for p, ids, out in zip(answering, prompts, _generate(generator, prompts, reply, seeds, stats)):
            row = rows[p.id]
            row["messages"].append({"role": "assistant", "content": tokenizer.decode(out.output_ids, skip_special_tokens=True)})
            row["turns"].append({"prompt_ids": ids, "output_ids": out.output_ids, "finish_reason": out.finish_reason})
    kept = [r for r in rows.values() if r["turns"]]
    lost = [{"id": r["id"], "reason": stopped[r["id"]]} for r in rows.values() if not r["turns"]]
    return kept, lost


# --- prompt files --------------------------------------------------------------------------------


def user_texts(row: Mapping[str, Any]) -> list[str]:
    """The user turns of a prompt or evaluation row: `text`, `turns` (strings) or user `messages`."""
    if isinstance(row.get("text"), str):
        return [row["text"]]
    if isinstance(row.get("turns"), list) and all(isinstance(t, str) for t in row["turns"]):
        return list(row["turns"])
    return [m["content"] for m in row.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)]


def eval_guard(path: str | Path | None) -> EvalGuard | None:
    """The evaluation prompts of a prompt file (text / turns / messages rows) as a guard."""
    if path is None:
        return None
    texts = [t for _, row in read_jsonl(path) for t in user_texts(row)]
    if not texts:
        raise DataError(f"{path}: no evaluation prompts in it (rows need `text`, `turns` or user `messages`).")
    return EvalGuard.of(texts)


def prompt_plans(path: str | Path, guard: EvalGuard | None = None) -> list[Plan]:
    """Plans of a prompt file (rows with `messages`, `turns` or `text`; `id` and `set` are kept);
    a prompt that overlaps an evaluation prompt is refused, naming its line."""
    plans, ids = [], set()
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        turns = [m["content"] for m in checked_messages(row, where) if m["role"] == "user"] if "messages" in row else user_texts(row)
        if not turns or not all(t.strip() for t in turns):
            raise DataError(f"{where}: no user turn to answer; give `messages` with user messages, `turns` or `text`.")
        rid = str(row.get("id", f"line-{number}"))
        if rid in ids:
            raise DataError(f"{where}: duplicate id {rid!r}; ids must be unique for resuming.")
        hit = next((t for t in turns if guard is not None and guard.overlaps(t)), None)
        if hit is not None:
            raise DataError(f"{where}: this prompt equals an evaluation prompt or shares an 8-word shingle with one "
                            f"({hit[:60]!r}...); remove it (training on evaluation prompts inflates tau).")
        ids.add(rid)
        plans.append(Plan(rid, "file", turns, {"set": row["set"]} if isinstance(row.get("set"), str) else {}))
    if not plans:
        raise DataError(f"{path}: no prompt rows.")
    return plans


# --- the recipe ------------------------------------------------------------------------------------


def recipe_plans(magpie: int, package: int, second_turn_share: float, seed: int, guard: EvalGuard, seen: set[str]) -> tuple[list[Plan], dict]:
    """Conversation plans of the recipe (before any generation) and what was dropped building them."""
    texts, dropped = dedup_and_guard(package_prompts(package, seed), guard, seen)
    plans = [Plan(f"package-{i}", "package", [t]) for i, t in enumerate(texts)]
    plans += [Plan(f"magpie-{i}", "magpie", [Magpie(system)]) for i, system in enumerate(steering_plan(magpie, seed))]
    rng = random.Random(seed + 1)
    for p in plans:
        if rng.random() < second_turn_share:
            p.user_turns.append(Magpie())
    return plans, {"package_prompts": {"kept": len(texts), **dropped}}


def split_heldout(rows: list[dict], heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """A seeded choice of `heldout` conversations (by id) kept out of training."""
    order = sorted(rows, key=lambda r: zlib.crc32(f"{seed}:{r['id']}".encode()))
    held = {r["id"] for r in order[:heldout]}
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


def file_entry(path: Path) -> dict:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"sha256": digest, "bytes": path.stat().st_size, "rows": sum(1 for _ in path.open(encoding="utf-8"))}


def build_dataset(out_dir: str | Path, tokenizer, generator: Generator, settings: Settings, *, magpie: int, package: int,
                  second_turn_share: float, heldout: int, exclude: str | Path, describe: Mapping[str, Any] = ()) -> dict:
    """The recipe: DIR/conversations.jsonl (resumable) -> DIR/train.jsonl + DIR/heldout.jsonl + DIR/manifest.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    guard = eval_guard(exclude)
    conversations = out / "conversations.jsonl"
    seen: set[str] = set()
    plans, prepared = recipe_plans(magpie, package, second_turn_share, settings.seed, guard, seen)
    if conversations.exists():  # resuming: the user turns already written count as seen
        done_ids(conversations)
        for _, row in read_jsonl(conversations):
            seen.update(normalised(t) for t in user_texts(row))
    t0 = time.perf_counter()
    stats = play(plans, conversations, tokenizer, generator, settings, guard, seen)
    rows = [row for _, row in read_jsonl(conversations)]
    if not rows:
        raise DataError(f"{conversations}: the recipe produced no conversation; see {conversations}.dropped for why.")
    train, held = split_heldout(rows, heldout, settings.seed)
    for name, part in (("train.jsonl", train), ("heldout.jsonl", held)):
        staged = out / f".{name}.tmp"
        staged.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), encoding="utf-8")
        os.replace(staged, out / name)
    dropped = [row for _, row in read_jsonl(conversations.with_name(conversations.name + ".dropped"))] \
        if conversations.with_name(conversations.name + ".dropped").exists() else []
    manifest = {
        **dict(describe),
        "seed": settings.seed, "sampling": {"replies": {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens},
                                            "user_turns": {"temperature": 1.0, "max_new_tokens": settings.user_max_new_tokens}},
        "recipe": {"magpie": magpie, "package": package, "second_turn_share": second_turn_share, "heldout": heldout,
                   "exclude": str(exclude), "steering": [{"share": share, "system": system} for share, system in STEERING]},
        "prepared": prepared,
        "counts": conversation_counts(rows, dropped),
        "this_call": {"generated_tokens": stats.generated_tokens, "generate_seconds": round(stats.generate_seconds, 1),
                      "tokens_per_s": round(stats.generated_tokens / max(stats.generate_seconds, 1e-9)), "wall_seconds": round(time.perf_counter() - t0, 1)},
        "files": {name: file_entry(out / name) for name in ("conversations.jsonl", "train.jsonl", "heldout.jsonl")},
    }
    staged = out / ".manifest.json.tmp"
    staged.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(staged, out / "manifest.json")
    return manifest


def conversation_counts(rows: list[dict], dropped: list[dict]) -> dict:
    by_source: dict[str, int] = {}
    for r in rows:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    reasons: dict[str, int] = {}
    for d in dropped:
        reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
    turns = [t for r in rows for t in r["turns"]]
    return {
        "conversations": len(rows), "by_source": by_source, "two_turn": sum(len(r["turns"]) > 1 for r in rows),
        "assistant_turns": len(turns), "reply_tokens": sum(len(t["output_ids"]) for t in turns),
        "prompt_tokens_last_turn": sum(len(r["turns"][-1]["prompt_ids"]) for r in rows),
        "replies_cut_at_max_new_tokens": sum(t["finish_reason"] == "length" for t in turns),
        "dropped_conversations": reasons,
    }
