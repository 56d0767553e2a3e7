"""The README's command blocks stay true: every `lilicorr ...` line of its bash blocks parses with the real CLI (each
flag and choice exists), every repository path it names exists, and the scripts and modules it runs are there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from sglang_lilicorr.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDERS = {
    "$T": "/models/target",
    "T": "/models/target",
    "TARGET": "/models/target",
    "DRAFT_DIR": "/drafts/d",
    "DRAFT": "/drafts/d",
    "...": "",
}


def bash_commands(text: str) -> list[str]:
    """Every command of the ```bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


COMMANDS = bash_commands((ROOT / "README.md").read_text())


def argv_of(command: str) -> list[str]:
    words = [PLACEHOLDERS.get(w, w) for w in shlex.split(command)]
    return [w for w in words if w]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("lilicorr ")])
def test_each_lilicorr_command_parses(command):
    argv = argv_of(command)[1:]
    if argv[:2] == ["bench", "report"] or argv[:2] == ["bench", "run"]:
        argv = [a.replace("HOST:PORT", "127.0.0.1:30000") for a in argv]
    args = build_parser().parse_args(argv)
    assert callable(args.func)


def test_the_paths_the_readme_runs_exist():
    named = set()
    for command in COMMANDS:
        for word in argv_of(command):
            if re.fullmatch(r"(testbed|scripts|checkpoints|tools|benchmarks)/[\w./-]+", word):
                named.add(word)
    assert {"testbed/eval_prompts.jsonl", "scripts/main.sh", "scripts/test.sh"} <= named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], missing


def test_the_training_example_names_the_mask_token_of_its_target():
    train = next(c for c in COMMANDS if c.startswith("lilicorr train "))
    assert "--mask-token '<empty_output>'" in train  # SmolLM2's: the trainer refuses a target without one
    assert any(c.startswith("T=~/.cache/sglang-lilicorr/smollm2-135m-instruct") for c in COMMANDS)
    from sglang_lilicorr.smollm2 import MODEL_FOLDER

    assert MODEL_FOLDER == "smollm2-135m-instruct"
