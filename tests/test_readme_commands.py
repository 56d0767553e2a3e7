"""The README's command blocks stay true: every `lilicorr ...` line of its bash blocks parses with the real CLI (each
flag and choice exists), every repository path it names exists, the scripts and modules it runs are there, and the
`lilicorr` lines run as written, one after another, at small sizes (a tiny random target for $T, the stub server for
HOST:PORT, SmolLM2's config.json for TARGET, which check-draft alone reads)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from test_train import TINY_HEAD_FLAGS, make_target

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
            if re.fullmatch(r"(scripts|checkpoints|benchmarks)/[\w./-]+", word):
                named.add(word)
    assert {"benchmarks/testbed/eval_prompts.jsonl", "scripts/main.sh", "scripts/test.sh"} <= named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], missing


def test_the_training_example_names_the_mask_token_of_its_target():
    train = next(c for c in COMMANDS if c.startswith("lilicorr train "))
    assert "--mask-token '<empty_output>'" in train  # SmolLM2's: the trainer refuses a target without one
    assert any(c.startswith("T=~/.cache/sglang-lilicorr/smollm2-135m-instruct") for c in COMMANDS)
    from sglang_lilicorr.commands.smollm2 import MODEL_FOLDER

    assert MODEL_FOLDER == "smollm2-135m-instruct"


# flags appended to a README line so that it runs in seconds on the CPU (the line's own flags stay: argparse keeps the
# last value of a flag given twice, and none of these is in the README)
SMALL = {
    ("regenerate",): ["--magpie", "4", "--package", "4", "--heldout", "2", "--max-new-tokens", "8"],
    ("train",): [
        "--max-steps",
        "2",
        "--block-size",
        "4",
        "--candidate-topk",
        "4",
        "--eval-examples",
        "2",
        *TINY_HEAD_FLAGS,
    ],
    ("bench", "run"): ["--limit", "2", "--max-tokens", "12", "--warmup", "1", "--no-progress"],
    ("bench", "report"): ["--no-plots"],
}


def small(argv: list[str]) -> list[str]:
    return argv + next((flags for words, flags in SMALL.items() if tuple(argv[: len(words)]) == words), [])


def test_the_lilicorr_lines_run_as_written(tmp_path, monkeypatch, capsys):
    """check-draft of the shipped draft; bench run (each system of the report line) -> bench report; regenerate ->
    train -> export; each line as the README gives it, in one working folder: what each writes is what the next
    reads."""
    from stub_server import StubServer

    from sglang_lilicorr.cli import main
    from sglang_lilicorr.drafter import load_draft

    monkeypatch.chdir(tmp_path)
    for folder in ("benchmarks", "checkpoints"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    target = make_target(tmp_path / "target", mask_token="<empty_output>")  # SmolLM2's mask token, as the line says
    lines = [argv_of(c.replace("$T", target))[1:] for c in COMMANDS if c.startswith("lilicorr ")]
    report = next(a for a in lines if a[:2] == ["bench", "report"])
    for argv in lines:
        if argv[:2] == ["bench", "run"]:  # once per results file the report line reads, under its system's name
            for results in (a for a in report if a.endswith(".jsonl")):
                system = Path(results).stem
                with StubServer(speculative=system != "ar", accept=3, step_s=0.001) as stub:
                    run = [a.replace("http://HOST:PORT", stub.url) for a in argv]
                    run[run.index("--system") + 1], run[run.index("--results") + 1] = system, results
                    assert main(small(run)) == 0, run
        elif argv[0] == "check-draft":
            smollm2 = str(ROOT / "tests" / "fixtures" / "smollm2-135m-instruct")
            assert main([a.replace(PLACEHOLDERS["TARGET"], smollm2) for a in argv]) == 0, argv
            assert "ok: serve with" in capsys.readouterr().out
        else:
            assert main(small(argv)) == 0, argv
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["counts"]["conversations"] > 0
    drafter, head = load_draft(tmp_path / "my-draft")
    assert head is not None and drafter.config.block_size == 4
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert {c["system"] for c in summary["cells"]} == {"ar", "lilicorr"}
    assert (tmp_path / "report" / "report.md").is_file()
