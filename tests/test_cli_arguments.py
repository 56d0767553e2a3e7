"""The arguments of every `lilicorr` subcommand as a new user meets them: each option has a help text in a named
group; a bad value is refused when it is parsed (or, for the settings `lilicorr train` checks together, before
anything loads) with exit 2 and one line naming the flag, the value and what is allowed, LILICORR_DEBUG=1 or not,
and nothing is written; an unknown option is answered by its command with the closest option it has; a folder one
level above a draft or a model names the folder that would work."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from sglang_lilicorr.cli import build_parser, main
from sglang_lilicorr.cli_args import finite_float

ROOT = Path(__file__).resolve().parents[1]


def commands(parser: argparse.ArgumentParser, prog=("lilicorr",)):
    """(prog words, parser) of every leaf subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prog, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from commands(sub, prog + (name,))


COMMANDS = dict(commands(build_parser()))


@pytest.mark.parametrize("prog", [" ".join(p) for p in COMMANDS])
def test_every_option_has_a_help_text_in_a_named_group(prog):
    parser = COMMANDS[tuple(prog.split())]
    group_of = {id(a): g.title for g in parser._action_groups for a in g._group_actions}
    bad = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        text = (action.help or "").strip()
        if len(text) < 12 or text.startswith("default"):
            bad.append(f"{name}: no help text ({text!r})")
        if action.option_strings and group_of[id(action)] in ("options", "optional arguments"):
            bad.append(f"{name}: in no named group (data, model, optimisation, output, ...)")
        if action.type is float:
            bad.append(f"{name}: a bare float takes nan and inf; use cli_args.bounded or finite_float")
    assert not bad, "\n".join(bad)
    parser.format_help()  # every text formats (a bare % would not)


def numeric(action: argparse.Action) -> bool:
    return action.type in (int, finite_float) or hasattr(action.type, "allowed")


@pytest.mark.parametrize("prog", [" ".join(p) for p in COMMANDS])
def test_no_numeric_option_takes_a_value_that_is_not_finite(prog):
    for action in COMMANDS[tuple(prog.split())]._actions:
        if numeric(action):
            for text in ("nan", "inf", "-inf", "1e999"):
                with pytest.raises((argparse.ArgumentTypeError, ValueError)):
                    action.type(text)


BASE = {
    "demo": ["demo"],
    "check-draft": ["check-draft", "d", "--target", "t"],
    "regenerate": ["regenerate", "--target", "t", "--prompts", "p.jsonl", "--output", "o.jsonl"],
    "train": ["train", "--target", "t", "--data", "d.jsonl", "--output-dir", "run"],
    "export": ["export", "run"],
    "replay": ["replay", "--target", "t", "--outputs", "o.jsonl", "--out", "rep"],  # --draft: its own case
    "bench run": [
        "bench",
        "run",
        "--url",
        "http://127.0.0.1:9",
        "--system",
        "s",
        "--dataset",
        "gsm8k",
        "--results",
        "r.jsonl",
    ],
    "bench report": ["bench", "report", "r.jsonl"],
}
CASES = {  # command -> (flag, bad value) pairs; the value goes after the flag (an empty flag: a positional)
    "demo": [("--threads", "-1"), ("--max-new-tokens", "0"), ("--max-new-tokens", "-5"), ("--walk", "x")]
    + [("--draft", "")],
    "regenerate": [("--magpie", "-1"), ("--package", "-1"), ("--second-turns", "1.5"), ("--heldout", "-1")]
    + [("--minutes", "-1"), ("--temperature", "-0.5"), ("--temperature", "inf"), ("--seed", "-1")]
    + [("--max-new-tokens", "0"), ("--servers", "0"), ("--concurrency", "0"), ("--url", "ftp://x")]
    + [("--server-args", "'a"), ("--engine", "x"), ("--chat-template-kwargs", "[1]")],
    "train": [("--head", "x"), ("--rope-scaling", "x"), ("--markov-head-type", "x"), ("--grad-clip", "0")]
    + [("--lr-drafter", "0"), ("--lr-head", "2"), ("--warmup-ratio", "1"), ("--mu", "1.5"), ("--beta", "0")]
    + [("--candidate-topk", "3"), ("--max-length", "3"), ("--output-dir", ""), ("--head-hidden-size", "33")],
    "export": [("--dtype", "int8"), ("", "")],
    "replay": [("--dtype", "x"), ("--draft", "noequals"), ("--out", "")],
    "bench run": [("--temperature", "inf"), ("--temperature", "-1"), ("--seeds", "-1"), ("--concurrency", "0")]
    + [("--max-tokens", "0"), ("--limit", "0"), ("--warmup", "-1"), ("--request-timeout", "0"), ("--url", "x")]
    + [("--request-timeout", "inf"), ("--api", "x")],
    "bench report": [("--out", "")],
}


def train_field_cases() -> list[tuple[str, str]]:
    """Every int setting of `lilicorr train` at -1 and every float one at nan and inf: none of them takes it."""
    from sglang_lilicorr.train.config import TrainConfig

    cases = []
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        values = {"int": ["-1"], "float": ["nan", "inf", "-inf"]}.get(str(field.type), [])
        cases += [(flag, v) for v in values]
    return cases


ALL = [(command, flag, value) for command, pairs in CASES.items() for flag, value in pairs] + [
    ("train", flag, value) for flag, value in train_field_cases()
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model or tokenizer load fails the test (the line would be 'this is a bug')."""
    import transformers

    import sglang_lilicorr.commands.smollm2 as smollm2

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    monkeypatch.setattr(smollm2, "load_smollm2", refuse)


def as_float(value: str) -> str:
    """How a float setting prints `value` ('-1' -> '-1.0'), else the value itself."""
    try:
        return repr(float(value))
    except ValueError:
        return value


def outcome(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("debug", ["0", "1"], ids=["plain", "LILICORR_DEBUG=1"])
def test_every_bad_value_is_one_line_exit_2_and_writes_nothing(debug, tmp_path, monkeypatch, capsys, no_model_loads):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LILICORR_DEBUG", debug)
    wrong = []
    for command, flag, value in ALL:
        given = [value] if not flag else [f"{flag}={value}"] if value.startswith("-") else [flag, value]
        argv = BASE[command] + given  # --flag=-x: argparse reads a lone -x as an option
        if command == "export" and flag:
            argv += ["out"]
        code, err = outcome(argv, capsys)
        lines = err.splitlines()
        line = lines[0] if lines else ""
        shown = value in line or as_float(value) in line
        named = (flag or "out_dir") in line and (shown or not value)
        if code != 2 or len(lines) != 1 or not line.startswith("error: ") or not named or "this is a bug" in err:
            wrong.append(f"{command} {flag} {value!r}: exit {code}: {err[:300]!r}")
    assert not wrong, "\n".join(wrong)
    assert list(tmp_path.iterdir()) == []


def test_the_issue_cases_name_the_allowed_range(capsys, no_model_loads):
    for argv, allowed in (
        (["demo", "--threads", "-1"], "is not an integer >= 0"),
        (["demo", "--max-new-tokens", "0"], "is not an integer >= 1"),
        (BASE["bench run"] + ["--temperature", "inf"], "is not a number >= 0"),
        (BASE["bench run"] + ["--seeds", "-1"], "is not an integer >= 0"),
        (BASE["train"] + ["--batch-size", "0"], "is not an integer >= 1"),
        (BASE["train"] + ["--head-hidden-size", "32", "--head-heads", "3"], "a multiple of the number of heads (3)"),
    ):
        code, err = outcome(argv, capsys)
        assert code == 2 and allowed in err, (argv, err)


def test_an_unknown_option_names_its_command_and_the_closest_option(capsys):
    code, err = outcome(["demo", "--max-tokens", "20"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "did you mean --max-new-tokens?" in err and "see `lilicorr demo --help`" in err
    code, err = outcome(BASE["bench run"] + ["--temprature", "0"], capsys)
    assert "did you mean --temperature?" in err and "`lilicorr bench run --help`" in err
    code, err = outcome(["trian"], capsys)
    assert code == 2 and "did you mean train?" in err
    code, err = outcome(["demo", "--zzz"], capsys)
    assert code == 2 and "did you mean" not in err and "`lilicorr demo --help`" in err


def test_a_folder_above_a_draft_or_a_model_names_the_one_below(tmp_path, capsys, no_model_loads):
    code, err = outcome(["demo", "--draft", str(ROOT / "checkpoints")], capsys)
    assert code == 2 and f"pass {ROOT / 'checkpoints' / 'smollm2-dflash'} or" in err
    assert str(ROOT / "checkpoints" / "smollm2-lilicorr") in err
    (tmp_path / "models" / "smol").mkdir(parents=True)
    (tmp_path / "models" / "smol" / "config.json").write_text("{}")
    draft = str(ROOT / "checkpoints" / "smollm2-lilicorr")
    code, err = outcome(["check-draft", draft, "--target", str(tmp_path / "models")], capsys)
    assert code == 2 and f"pass {tmp_path / 'models' / 'smol'} (one level down" in err
    code, err = outcome(["check-draft", str(tmp_path / "models"), "--target", str(tmp_path)], capsys)
    assert code == 2 and f"pass {tmp_path / 'models' / 'smol'} (one level down" in err


def test_replay_reads_its_inputs_before_loading_the_target_or_writing(tmp_path, capsys, no_model_loads):
    """A missing --outputs file, or one without turns, ends replay before the target loads and before the report
    folder is made."""
    from test_exit_codes import tree

    (tmp_path / "noturns.jsonl").write_text('{"id": "a", "messages": []}\n')
    for outputs, want in (("none.jsonl", 2), ("noturns.jsonl", 1)):
        argv = ["replay", "--target", str(ROOT / "checkpoints" / "smollm2-lilicorr"), "--draft"]
        argv += [f"a={ROOT / 'checkpoints' / 'smollm2-lilicorr'}", "--outputs", str(tmp_path / outputs)]
        before = tree(tmp_path)
        code, err = outcome(argv + ["--out", str(tmp_path / "report")], capsys)
        assert code == want and err.count("\n") == 1 and "this is a bug" not in err, err
        assert tree(tmp_path) == before


def test_help_shows_choices_units_and_defaults():
    text = COMMANDS[("lilicorr", "train")].format_help()
    assert "--head {lilicorr,domino,dspark,none}" in text and "(default: lilicorr)" in text
    assert "--beta X" in text and "(> 0) (default: 7.0)" in text
    assert "--target PATH" in text and "local Hugging Face folder" in text
    assert all(t in text for t in ("\ndata:", "\noptimisation:", "\noutput:", "\nobjective:"))
