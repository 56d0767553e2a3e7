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


STEP = re.compile(r"(?:python3?|torchrun[^`\n]*?) (?:-P )?-m benchmarks ([a-z][\w-]*)")


def test_every_lab_step_a_document_or_script_runs_exists():
    """`python -m benchmarks STEP` in the documents, the shell scripts and the code names a step of the lab's entry
    point (benchmarks/__init__.py), and benchmarks/README.md's table lists every step, each with its module."""
    from benchmarks import STEPS

    files = documents() + [p for p in tracked("*.sh") + tracked("*.py") if not p.startswith("benchmarks/results/")]
    unknown = sorted({(p, s) for p in files for s in STEP.findall((ROOT / p).read_text()) if s not in STEPS})
    assert unknown == [], unknown
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    table = dict(re.findall(r"^\| `([\w-]+)` \| `([\w/.]+)` \|", readme, re.M))
    assert table == {
        s: module.removeprefix("benchmarks.").replace(".", "/") + ".py" for s, (module, _) in STEPS.items()
    }


def test_every_lilicorr_command_a_document_gives_exists():
    """Each `lilicorr ...` line of a document's code blocks names a subcommand the CLI has (README.md's lines also
    parse and run: tests/test_readme_commands.py)."""
    from sglang_lilicorr.cli import build_parser

    def choices(parser):
        sub = next((a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"), None)
        return sub.choices if sub else {}

    top = choices(build_parser())
    wrong = []
    for doc in documents():
        for block in re.findall(r"```[a-z]*\n(.*?)```", (ROOT / doc).read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = line.split("#", 1)[0].split()
                if words[:1] != ["lilicorr"] or len(words) < 2:
                    continue
                sub = top.get(words[1])
                if sub is None or (choices(sub) and (len(words) < 3 or words[2] not in choices(sub))):
                    wrong.append(f"{doc}: {' '.join(words[:3])}")
    assert wrong == [], wrong
