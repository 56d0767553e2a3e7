"""Every repository path the documents cite exists (scripts, modules, result folders and files), every result folder
follows benchmarks/results/<topic>/<card>_<commit>[_<what>]/, and benchmarks/results/INDEX.md cites each of them, with
nothing it cites missing. The documents: every tracked Markdown file."""

from __future__ import annotations

import glob
import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# a path from the repository's root: one of these top-level folders, then at least one more part
CITED = re.compile(
    r"(?<![\w./$-])((?:benchmarks|testbed|tools|scripts|checkpoints|docs|tests|sglang_lilicorr)/[\w./{},*-]*[\w/}*])"
)
# scripts that made old results, since removed: the result folders still cite them as their commands (each README
# says `git show COMMIT:PATH`); checked to be in history instead
RETIRED = {"testbed/serve_eval.sh": "8874f4f^", "testbed/serve_pairs.sh": "8874f4f^"}
FOLDER = re.compile(r"[a-z0-9-]+/h[12]00(x\d)?_[0-9a-f]{7}(_[\w-]+)?")


def tracked(pattern: str) -> list[str]:
    return subprocess.run(
        ["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()


def documents() -> list[str]:
    """Tracked Markdown but the result records (a result folder's reports and tables: what a command wrote then)."""
    return [
        p
        for p in tracked("*.md")
        if (ROOT / p).is_file()
        and (not p.startswith("benchmarks/results/") or Path(p).name in ("README.md", "INDEX.md"))
    ]


def expand(path: str) -> list[str]:
    """`a/{b,c}.json` -> a/b.json, a/c.json (bash's brace expansion, one level per brace)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def exists(path: str, base: Path = ROOT) -> bool:
    if path in RETIRED:  # a clone without that history (shallow) cannot tell: accepted
        have = subprocess.run(
            ["git", "rev-parse", "-q", "--verify", f"{RETIRED[path]}^{{commit}}"], cwd=ROOT, capture_output=True
        )
        return (
            have.returncode != 0
            or subprocess.run(["git", "cat-file", "-e", f"{RETIRED[path]}:{path}"], cwd=ROOT).returncode == 0
        )
    return any(
        glob.glob(str(root / p)) if "*" in p else (root / p).exists() for p in expand(path) for root in {ROOT, base}
    )


def cited(text: str) -> set[str]:
    """The repository paths of a text, less placeholders (`<card>`, NAME) and what `git show` / `git ls-tree` read
    from history."""
    text = re.sub(r"`git (show|ls-tree) [^`]*`", "", text)
    found = {m.group(1).rstrip(".,") for m in CITED.finditer(text) if text[m.end() : m.end() + 1] not in ("$", "-")}
    return {p for p in found if "<" not in p and not re.search(r"(^|/)[A-Z][A-Z0-9_]+(/|$)", p)}


@pytest.mark.parametrize("doc", documents())
def test_every_path_a_document_cites_exists(doc):
    missing = sorted(p for p in cited((ROOT / doc).read_text()) if not exists(p, (ROOT / doc).parent))  # or beside it
    assert missing == [], f"{doc} cites paths that do not exist: {missing}"


def result_folders() -> set[str]:
    """<topic>/<folder> of every tracked result file (a topic folder may hold a README and summaries of its own)."""
    folders = set()
    for f in tracked("benchmarks/results"):
        parts = Path(f).relative_to("benchmarks/results").parts
        if len(parts) >= 3:
            folders.add("/".join(parts[:2]))
    return folders


def test_result_folders_follow_one_scheme():
    bad = sorted(f for f in result_folders() if not FOLDER.fullmatch(f))
    assert bad == [], f"not <topic>/<card>_<commit>[_<what>]: {bad}"
    assert not (ROOT / "testbed" / "results").exists()


def test_the_index_cites_every_result_folder_and_nothing_missing():
    text = (RESULTS / "INDEX.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    listed = {re.match(r"\| `([^`]+)`", row).group(1).rstrip("/") for row in rows}
    missing = sorted(p for p in listed if not (RESULTS / p).exists())
    assert missing == [], f"INDEX.md lists folders that do not exist: {missing}"
    unlisted = sorted(result_folders() - listed)
    assert unlisted == [], f"result folders INDEX.md does not list: {unlisted}"
    no_command = [row for row in rows if not row.rstrip(" |").split(" | ")[-1].strip()]
    assert no_command == [], f"rows without the command that made them: {no_command}"
