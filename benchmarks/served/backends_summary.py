"""The attention backends' `benchmarks/results/backends/summary.json`: LILICORR per attention-backend combination
served.

The file is a JSON object keyed "TARGET/DRAFT" (the target's --attention-backend / the drafter's), e.g. "triton/triton"
and "flashinfer/triton"; each entry:

  target, draft, sampling  the target's and the drafter's attention backends, the servers' --sampling-backend
  greedy_ok                the served greedy check passed (benchmarks/device/gpu_check.sh lilicorr,check): >= 88 greedy
                           LILICORR responses, no token off the fp32 target's greedy choice beyond the check's near-tie
                           tolerance, the proposal captured in the draft CUDA graph
  greedy                   {responses, tokens, off, near_ties, tol_ulps, draft_graph}
  t1_min_p                 the smallest p of LILICORR's chi-square test per position at T = 1 (gpu_check.sh sampling);
                           t1_p {position: p}; t1_verification: the server's start-up line naming its verification
  tok_s                    {c: {system: tok/s}}: no speculation (base), DFLASH, the built-in LiLiCorr head, LILICORR,
                           the served-speed benchmark's means over its paired rounds (benchmarks/testbed/speed.py)
  lilicorr_vs_base         {c: [mean, lo, hi]}: LILICORR's tok/s over no speculation's, paired within rounds, 95 % t
  block_over_decode        {c: x}: LILICORR's ms per verify block over the no-speculation decode step, same rounds
  rounds                   {c: paired rounds}
  card, commit             where it ran; ", "-joined where its parts ran on several cards or commits
  measured                 {greedy: "CARD, COMMIT", t1: ..., tok_s: {c: "CARD, COMMIT"}}; sources: the files read

A run of benchmarks/device/backends.sh (every call's results.tar.gz unpacked into DIR) makes the TARGET/triton entry
(--target, flashinfer) from DIR/greedy/summary.txt, DIR/t1/sampling_summary.json and
DIR/speed/graphs32_TARGET/speed_summary.json, card and commit from --card and --commit. A run may hold some of the
three: a part it lacks is kept from that entry in OUT/summary.json, with where it was measured and the file it was
read from (a run of calls 1-3 first, the speed calls in a later session); greedy and T = 1 must be had from one or the
other, speed may wait (tok_s empty until measured). The triton/triton entry comes from committed Triton results
(--triton-greedy, --triton-t1, --triton-speed: their card and commit from their folders' names,
<card>_<commit>[_what], and the speed file's `measured`), its speed cells replaced by DIR/speed/graphs32/ (the same
machine's Triton rounds: backends.sh triton-speed) where the run has them. Every input's backends are checked against
its entry's: a server log's server_args line beside it, else gpu_check.sh's "backends:" line or the speed step's
`backends`, else (a file from before they were recorded) the kit's Triton and PyTorch. Entries of other combinations
already in OUT/summary.json are kept. Writes OUT/summary.json, OUT/summary.md (the tables, the c = 1 target,
a README row) and OUT/summary.png (per combination and c: the speedup with its interval, the block in decode steps).

  python -m benchmarks backends-summary --run DIR --card CARD --commit C --out OUT
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from sglang_lilicorr.errors import UsageError
from benchmarks import save_json

SYSTEMS = ("base", "dflash", "builtin", "lilicorr")
LABELS = ("no spec.", "DFLASH", "built-in", "LILICORR")
MIN_GREEDY = 88  # gpu_check.sh's greedy responses (56 one at a time, 32 concurrent)
KIT = {"attention": "triton", "sampling": "pytorch", "draft": "triton"}  # every server before backends were chosen
CARDS = {"h100": "H100 80GB HBM3", "h200": "H200 (nvidia-h200)"}
RESULTS = Path("benchmarks/results")
TRITON_GREEDY = RESULTS / "served-greedy/h100_0754956_splitkv/summary.txt"  # the shipped draft, today's split-KV verify
TRITON_T1 = RESULTS / "sampling/h100_ee73f57/summary.json"
TRITON_SPEED = RESULTS / "serve-speed/summary.json"
KEYS = {
    "attention_backend": "attention",
    "sampling_backend": "sampling",
    "speculative_draft_attention_backend": "draft",
}
LOGGED = re.compile(r"'(attention_backend|sampling_backend|speculative_draft_attention_backend)': '?([\w.-]+)'?")
FLAGS = re.compile(r"(?<![\w-])--(attention|sampling|speculative-draft-attention)-backend[ =]([\w.-]+)")
GREEDY = re.compile(
    r"^(?P<path>\S*lilicorr\.json): (?P<responses>\d+) greedy responses, (?P<tokens>\d+) tokens, (?P<off>\d+) with a "
    r"token that is not the target's greedy choice beyond (?P<tol>[\d.]+) bf16 ulp, (?P<near>\d+) near-tie",
    re.M,
)
FOLDER = re.compile(r"(h[12]00(?:x\d)?)_([0-9a-f]{7,40})(?:_[\w-]+)?")


def backends_in(text: str) -> dict:
    """{"attention", "sampling", "draft"} a server log's server_args line names (its first), else server flags (the
    last of each); the keys found only."""
    found = {}
    for m in LOGGED.finditer(text):
        found.setdefault(KEYS[m.group(1)], m.group(2))
    if not found:
        for m in FLAGS.finditer(text):
            found[{"speculative-draft-attention": "draft"}.get(m.group(1), m.group(1))] = m.group(2)
    return {k: v for k, v in found.items() if v != "None"}


def check_backends(found: dict, expect: dict, what: str) -> None:
    """`found` (KIT's where it names none) against `expect`: a UsageError naming the mismatch."""
    got = {**KIT, **found}
    bad = [k for k in expect if got[k] != expect[k]]
    if bad:
        names = ", ".join(f"{k} {got[k]} (not {expect[k]})" for k in bad)
        raise UsageError(f"{what} was served with {names}", fix="pass the files of that combination's run")


def read(path: Path, flag: str, fix: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError as e:
        raise UsageError(f"{flag} {path}: {e.strerror or e}", fix=fix) from e


def read_json(path: Path, flag: str, fix: str) -> dict:
    try:
        doc = json.loads(read(path, flag, fix))
    except ValueError as e:
        raise UsageError(f"{flag} {path}: not JSON ({e})", fix=fix) from e
    if not isinstance(doc, dict):
        raise UsageError(f"{flag} {path}: not a JSON object", fix=fix)
    return doc


def log_backends(path: Path) -> dict:
    return backends_in(path.read_text(errors="replace")) if path.is_file() else {}


def greedy_keys(path: Path, expect: dict, flag: str) -> dict:
    """gpu_check.sh's summary.txt (the check's line for lilicorr.json) -> greedy_ok, greedy."""
    fix = "pass the summary.txt of `gpu_check.sh lilicorr,check` (benchmarks/device/backends.sh greedy)"
    text = read(path, flag, fix)
    lines = list(GREEDY.finditer(text))
    if not lines:
        raise UsageError(f"{flag} {path}: no check line of lilicorr.json ('N greedy responses, ...')", fix=fix)
    said = [line for line in text.splitlines() if "] backends: " in line]
    check_backends(log_backends(path.parent / "lilicorr.log") or backends_in("\n".join(said[-1:])), expect, str(path))
    m = lines[-1]
    greedy = {
        "responses": int(m["responses"]),
        "tokens": int(m["tokens"]),
        "off": int(m["off"]),
        "near_ties": int(m["near"]),
        "tol_ulps": float(m["tol"]),
        "draft_graph": "DRAFT_GRAPH_CHECK PASS" in text,
    }
    ok = greedy["responses"] >= MIN_GREEDY and greedy["off"] == 0 and greedy["draft_graph"]
    return {"greedy_ok": ok, "greedy": greedy}


def t1_keys(path: Path, expect: dict, flag: str) -> dict:
    """gpu_check.sh sampling's sampling_summary.json (LILICORR's p per position) -> t1_min_p, t1_p, t1_verification."""
    fix = "pass the sampling_summary.json of `gpu_check.sh sampling` with LILICORR among SAMPLING_SYSTEMS"
    cell = read_json(path, flag, fix).get("lilicorr") or {}
    p = {pos: c["p"] for pos, c in (cell.get("positions") or {}).items() if c.get("p") is not None}
    if not p:
        raise UsageError(f"{flag} {path}: no p-value of lilicorr", fix=fix)
    check_backends(log_backends(path.parent / "lilicorr.log"), expect, str(path))
    return {"t1_min_p": round(min(p.values()), 6), "t1_p": p, "t1_verification": cell.get("verification")}


def speed_cells(path: Path, expect: dict, flag: str) -> tuple[dict, dict | None]:
    """The speed step's speed_summary.json or serve_speed's results file -> ({c: cell} where all of SYSTEMS ran,
    {c: "CARD, COMMIT"} from the results file's `measured`, None for the speed step's)."""
    fix = "pass a speed step's speed_summary.json (WORK/speed/FOLDER/) or serve_speed's summary.json"
    doc = read_json(path, flag, fix)
    if isinstance(doc.get("summary"), dict):
        cells, measured = doc["summary"], None
        record = path.parent / "speed_run.json"
        found = doc.get("backends") or (
            backends_in((json.loads(record.read_text()).get("server_args") or {}).get("lilicorr", ""))
            if record.is_file()
            else {}
        )
    else:
        cells = {c: e for c, e in doc.items() if c.isdigit()}
        where = f"{doc.get('card')}, {doc.get('commit')}"
        measured = {c: (doc.get("measured") or {}).get(c, where) for c in cells}
        found = doc.get("backends") or {}
    cells = {c: e for c, e in cells.items() if isinstance(e, dict) and all(s in e for s in SYSTEMS)}
    if not cells:
        raise UsageError(f"{flag} {path}: no concurrency where {', '.join(SYSTEMS)} all ran", fix=fix)
    check_backends({k: v for k, v in found.items() if k in ("attention", "sampling")}, expect, str(path))
    return cells, measured


def folder_measured(path: Path, flag: str) -> str:
    """ "CARD, COMMIT" of a committed result from its folder's name (benchmarks/results/INDEX.md's scheme)."""
    m = FOLDER.fullmatch(Path(path).parent.name)
    if not m:
        raise UsageError(
            f"{flag} {path}: its folder is not named <card>_<commit>[_what]", fix="pass a committed result's file"
        )
    return f"{CARDS.get(m[1], m[1])}, {m[2][:7]}"


def entry(target: str, sampling: str, parts: dict, cells: dict, measured: dict, sources: dict) -> dict:
    """One combination's entry (module docstring) from its greedy and T = 1 keys (`parts`) and speed cells."""
    order = sorted(cells, key=int)
    where = [measured["greedy"], measured["t1"], *(measured["tok_s"][c] for c in order)]
    cards, commits = (list(dict.fromkeys(w.rsplit(", ", 1)[i] for w in where)) for i in (0, 1))
    return {
        "target": target,
        "draft": KIT["draft"],
        "sampling": sampling,
        **parts,
        "tok_s": {c: {s: cells[c][s] for s in SYSTEMS} for c in order},
        "lilicorr_vs_base": {c: cells[c].get("lilicorr_vs_base") for c in order},
        "block_over_decode": {c: (cells[c].get("block_over_decode") or {}).get("lilicorr") for c in order},
        "rounds": {c: cells[c].get("rounds") for c in order},
        "card": ", ".join(cards),
        "commit": ", ".join(commits),
        "measured": {**measured, "tok_s": {c: measured["tok_s"][c] for c in order}},
        "sources": {k: str(v) for k, v in sources.items()},
    }


def markdown(doc: dict, run_key: str) -> str:
    """The combinations (the entries of the module docstring's shape), their speed per c, the c = 1 target and
    a README row."""
    doc = {k: e for k, e in doc.items() if isinstance(e, dict) and {"greedy", "t1_min_p", "tok_s"} <= set(e)}
    out = ["# LILICORR per attention backend", ""]
    out += ["| target / draft | sampling | greedy check | T = 1 min p | measured |", "|---|---|---|---|---|"]
    for e in doc.values():
        g = e["greedy"]
        verdict = f"{'pass' if e['greedy_ok'] else 'FAIL'}: {g['responses']} responses, {g['off']} off ({g['tokens']}"
        verdict += f" tokens), draft graph {'captured' if g['draft_graph'] else 'NOT captured'}"
        out.append(f"| {e['target']} / {e['draft']} | {e['sampling']} | {verdict} | {e['t1_min_p']:.3g} | ")
        out[-1] += "; ".join(dict.fromkeys(e["measured"][part] for part in ("greedy", "t1"))) + " |"
    tok_s = " | ".join(f"{label} tok/s" for label in LABELS)
    out += ["", f"| target / draft | c | {tok_s} | LILICORR / no spec. | block / decode step | rounds | measured |"]
    out.append("|" + "---|" * 10)
    for e in doc.values():
        for c, tok in e["tok_s"].items():
            ratio, block = e["lilicorr_vs_base"][c], e["block_over_decode"][c]
            cells = [f"{e['target']} / {e['draft']}", c, *(f"{tok[s]:.0f}" for s in SYSTEMS)]
            cells += [f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]" if ratio else "-"]
            cells += [f"{block:.2f}" if block is not None else "-", str(e["rounds"][c]), e["measured"]["tok_s"][c]]
            out.append("| " + " | ".join(cells) + " |")
    run, tri = doc.get(run_key), doc.get("triton/triton")
    if run and tri and "1" in run["tok_s"] and "1" in tri["tok_s"]:
        a, b = run["lilicorr_vs_base"]["1"], tri["lilicorr_vs_base"]["1"]
        if a and b:
            met = "met" if a[0] >= b[0] else "NOT met"
            out += ["", f"c = 1, LILICORR / no speculation: {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}] on {run['target']}"]
            out[-1] += f" ({run['measured']['tok_s']['1']}), {b[0]:.3f} [{b[1]:.3f}, {b[2]:.3f}] on triton "
            out[-1] += f"({tri['measured']['tok_s']['1']}): the c = 1 target (at least Triton's) {met}."
            block = run["block_over_decode"]["1"], tri["block_over_decode"]["1"]
            out += ["", "README row:", ""]
            out.append(
                f"| LILICORR on {run['target']} attention (target; draft on {run['draft']}) | greedy "
                f"{'lossless' if run['greedy_ok'] else 'FAILED'} ({run['greedy']['responses']} responses), T = 1 min p "
                f"{run['t1_min_p']:.2g}; c = 1 / no spec. {a[0]:.2f} (Triton {b[0]:.2f}), block "
                f"{block[0]:.2f} decode steps (Triton {block[1]:.2f}) | {run['card']}, {run['commit']} | "
                "`benchmarks/results/backends/` |"
            )
    return "\n".join(out) + "\n"


def plot(doc: dict, path: Path) -> Path:
    """Per backend combination against concurrency: LILICORR over no speculation with its paired interval (left) and
    the verify block in no-speculation decode steps (right)."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    entries = {k: e for k, e in doc.items() if isinstance(e, dict) and e.get("tok_s")}
    for i, (key, e) in enumerate(sorted(entries.items())):
        cs = [c for c in sorted(e["tok_s"], key=int) if e["lilicorr_vs_base"].get(c)]
        if not cs:
            continue
        ratio = [e["lilicorr_vs_base"][c] for c in cs]
        ax.errorbar(
            [int(c) for c in cs],
            [r[0] for r in ratio],
            yerr=[[r[0] - r[1] for r in ratio], [r[2] - r[0] for r in ratio]],
            fmt="-o",
            color=f"C{i}",
            capsize=3,
            label=key,
        )
        bx.plot([int(c) for c in cs], [e["block_over_decode"][c] for c in cs], "-o", color=f"C{i}", label=key)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="concurrency", ylabel="LILICORR / no speculation (paired, 95 % CI)", title="speedup")
    bx.set(xscale="log", xlabel="concurrency", ylabel="decode steps", title="LILICORR's block / a decode step")
    ax.legend(fontsize=7, title="target / draft (cards, commits: summary.md)", title_fontsize=7, loc="lower left")
    bx.legend(fontsize=7, loc="upper left")
    return save(fig, path)


def kept_parts(entry: dict | None) -> dict:
    """An earlier entry of OUT/summary.json -> {part: (keys, measured, source)} for its greedy, t1 and speed parts it
    holds (speed as cells, the shape speed_cells gives; source: the file the part was read from)."""
    if not entry:
        return {}
    measured, sources, kept = entry.get("measured") or {}, entry.get("sources") or {}, {}
    if "greedy" in entry:
        kept["greedy"] = ({k: entry[k] for k in ("greedy_ok", "greedy")}, measured.get("greedy"), sources.get("greedy"))
    if "t1_min_p" in entry:
        t1 = {k: entry.get(k) for k in ("t1_min_p", "t1_p", "t1_verification")}
        kept["t1"] = (t1, measured.get("t1"), sources.get("t1"))
    if entry.get("tok_s"):
        cells = {
            c: {
                **tok,
                "lilicorr_vs_base": entry["lilicorr_vs_base"][c],
                "block_over_decode": {"lilicorr": entry["block_over_decode"][c]},
                "rounds": entry["rounds"][c],
            }
            for c, tok in entry["tok_s"].items()
        }
        kept["speed"] = (cells, measured.get("tok_s") or {}, sources.get("speed"))
    return kept


def build(args, earlier: dict) -> tuple[dict, str]:
    """The entries of the run's combination and of Triton (module docstring) -> (the summary, its key of the run)."""
    run, here = Path(args.run), f"{args.card}, {args.commit}"
    expect = {"attention": args.target, "sampling": args.sampling, "draft": KIT["draft"]}
    key = f"{args.target}/{KIT['draft']}"
    files = {
        "greedy": run / "greedy" / "summary.txt",
        "t1": run / "t1" / "sampling_summary.json",
        "speed": run / "speed" / f"graphs32_{args.target}" / "speed_summary.json",
    }
    kept = kept_parts(earlier.get(key))
    absent = [what for what, path in files.items() if not path.is_file()]
    nothing = len(absent) == len(files)  # a run of none of the three parts is a mistake even where all are kept
    missing = absent if nothing else [what for what in absent if what not in kept and what != "speed"]
    if missing:
        raise UsageError(
            f"--run {run}: no {', '.join(str(files[w].relative_to(run)) for w in missing)} (the "
            f"{', '.join(missing)} step's)"
            + ("" if nothing else f", and no {key} entry in {args.out / 'summary.json'} holds it"),
            fix="unpack every backends.sh call's results.tar.gz into one folder and pass it as --run",
        )
    parts, measured = {}, {}
    for what, read_part in (("greedy", greedy_keys), ("t1", t1_keys)):
        if files[what].is_file():
            parts |= read_part(files[what], expect, "--run")
            measured[what] = here
        else:
            parts, measured[what], files[what] = parts | kept[what][0], *kept[what][1:]
    if files["speed"].is_file():
        cells, _ = speed_cells(files["speed"], {k: expect[k] for k in ("attention", "sampling")}, "--run")
        measured["tok_s"] = {c: here for c in cells}
    else:
        cells, measured["tok_s"], files["speed"] = kept.get("speed", ({}, {}, "not yet measured"))
    doc = {key: entry(args.target, args.sampling, parts, cells, measured, files)}

    kit = {"attention": KIT["attention"], "sampling": KIT["sampling"]}
    tri_files = {"greedy": args.triton_greedy, "t1": args.triton_t1, "speed": args.triton_speed}
    tri_parts = greedy_keys(args.triton_greedy, KIT, "--triton-greedy") | t1_keys(args.triton_t1, KIT, "--triton-t1")
    tri_cells, tri_measured = speed_cells(args.triton_speed, kit, "--triton-speed")
    if tri_measured is None:  # a speed step's own file: measured where --triton-speed's folder says, else here
        tri_measured = {c: here for c in tri_cells}
    same_machine = run / "speed" / "graphs32" / "speed_summary.json"
    if same_machine.is_file():  # the run's own Triton rounds replace the committed cells they measured
        own, _ = speed_cells(same_machine, kit, "--run")
        tri_cells, tri_measured = {**tri_cells, **own}, {**tri_measured, **{c: here for c in own}}
        tri_files["speed_same_machine"] = same_machine
    triton = {
        "greedy": folder_measured(args.triton_greedy, "--triton-greedy"),
        "t1": folder_measured(args.triton_t1, "--triton-t1"),
        "tok_s": tri_measured,
    }
    doc["triton/triton"] = entry("triton", KIT["sampling"], tri_parts, tri_cells, triton, tri_files)
    return doc, key


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="The attention backends' summary (module docstring).",
    )
    p.add_argument("--run", type=Path, required=True, help="the backends.sh calls' results.tar.gz unpacked here")
    p.add_argument("--card", required=True, help="the run's card, e.g. 'H200 (nvidia-h200)'")
    p.add_argument("--commit", required=True, help="the commit the run measured")
    p.add_argument("--target", default="flashinfer", help="the run's target attention backend (flashinfer)")
    p.add_argument("--sampling", default="flashinfer", help="the run's sampling backend (flashinfer)")
    p.add_argument("--triton-greedy", type=Path, default=TRITON_GREEDY, help=f"default {TRITON_GREEDY}")
    p.add_argument("--triton-t1", type=Path, default=TRITON_T1, help=f"default {TRITON_T1}")
    p.add_argument("--triton-speed", type=Path, default=TRITON_SPEED, help=f"default {TRITON_SPEED}")
    p.add_argument("--out", type=Path, required=True, help="writes OUT/summary.json (other entries kept), summary.md")
    args = p.parse_args(argv)
    try:
        if args.target == KIT["attention"]:
            raise UsageError(
                f"--target {args.target}: the triton/triton entry comes from the committed Triton results",
                fix="pass the run's other target backend (flashinfer)",
            )
        path = args.out / "summary.json"
        fix = "point --out at the backends results folder, or move the file"
        earlier = read_json(path, "--out", fix) if path.exists() else {}
        doc, key = build(args, earlier)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    doc = {**{k: v for k, v in earlier.items() if k not in doc}, **doc}
    save_json(path, doc)
    text = markdown(doc, key)
    (args.out / "summary.md").write_text(text)
    figure = plot(doc, args.out / "summary.png")
    print(text + f"-> {path}, {args.out / 'summary.md'}, {figure}")
    return 0
