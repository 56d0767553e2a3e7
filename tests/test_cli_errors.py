"""One error style for every `lilicorr` subcommand: one line `error: <what> (<where>): <fix>` on stderr,
exit 2 for usage errors and 1 for runtime errors, no traceback unless LILICORR_DEBUG=1."""

import argparse
import json

import pytest

from sglang_lilicorr.checkpoint import CheckpointError
from sglang_lilicorr.cli import main, run
from sglang_lilicorr.errors import LiLiCorrError, UsageError
from stub_server import bench_run_argv
from test_export_safety import write_run


def fails_with(exc: BaseException):
    def func(_args):
        raise exc

    return argparse.Namespace(func=func)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_project_errors_are_one_line_with_their_exit_code(capsys, monkeypatch):
    monkeypatch.delenv("LILICORR_DEBUG", raising=False)
    assert run(fails_with(CheckpointError("a.json is corrupt", where="a.json", fix="re-export it"))) == 1
    assert one_line(capsys) == "error: a.json is corrupt (a.json): re-export it\n"
    assert run(fails_with(UsageError("--x 3 is out of range\nover two lines", fix="pass 1"))) == 2
    assert one_line(capsys) == "error: --x 3 is out of range over two lines: pass 1\n"
    assert run(fails_with(FileNotFoundError(2, "No such file or directory", "/no/such"))) == 1
    assert "No such file or directory (/no/such)" in one_line(capsys)


def test_an_unexpected_exception_is_one_line_naming_where(capsys, monkeypatch):
    monkeypatch.delenv("LILICORR_DEBUG", raising=False)
    assert run(fails_with(ZeroDivisionError("division by zero"))) == 1
    err = one_line(capsys)
    assert (
        "unexpected ZeroDivisionError: division by zero" in err
        and "test_cli_errors.py:" in err
        and "LILICORR_DEBUG=1" in err
    )


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("LILICORR_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        run(fails_with(ZeroDivisionError("division by zero")))


def test_every_project_error_type_shares_the_base():
    from sglang_lilicorr.bench.client import ServerError
    from sglang_lilicorr.bench.metrics import ResultsError
    from sglang_lilicorr.bench.prompt_file import PromptFileError
    from sglang_lilicorr.bench.speed_bench import SpeedBenchFormatError
    from benchmarks.served.stages import StageSchemaError
    from sglang_lilicorr.config import ConfigError
    from sglang_lilicorr.drafter import DrafterConfigError, DrafterShapeError
    from sglang_lilicorr.frozen_target import TargetMismatchError
    from sglang_lilicorr.oracle import ObjectiveInputError
    from sglang_lilicorr.serving.draft_check import ServingConfigError
    from sglang_lilicorr.commands.smollm2 import SmolLM2Error

    for kind in (
        CheckpointError,
        ConfigError,
        DrafterConfigError,
        DrafterShapeError,
        TargetMismatchError,
        ObjectiveInputError,
        ServingConfigError,
        SmolLM2Error,
        ServerError,
        ResultsError,
        PromptFileError,
        SpeedBenchFormatError,
        StageSchemaError,
    ):
        assert issubclass(kind, LiLiCorrError), kind
    assert issubclass(DrafterConfigError, CheckpointError)  # loading a draft raises CheckpointError only


def test_argparse_errors_are_one_line_exit_2(capsys):
    assert main(["export"]) == 2
    assert "lilicorr export" in one_line(capsys)


def test_a_target_that_is_not_a_local_folder_fails_at_once(tmp_path, capsys, monkeypatch):
    import transformers

    def no_hub(*args, **kwargs):
        raise AssertionError("transformers must not see the path")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert (
        main(
            ["regenerate", "--target", "org/not-here", "--prompts", str(prompts), "--output", str(tmp_path / "o.jsonl")]
        )
        == 2
    )
    assert "'org/not-here' is not an existing folder (--target)" in one_line(capsys)
    assert main(["check-draft", str(tmp_path), "--target", str(tmp_path)]) == 2
    assert "a folder without config.json" in one_line(capsys)


def test_export_of_a_bad_training_state_is_one_line(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run")
    step = run_dir / "checkpoints" / "step-00000002"
    state = json.loads((step / "train_state.json").read_text())
    del state["head_config"]
    (step / "train_state.json").write_text(json.dumps(state))
    assert main(["export", str(run_dir), str(tmp_path / "a")]) == 1
    assert "head_config" in one_line(capsys)

    run_dir = write_run(tmp_path / "run2")
    tensors = run_dir / "checkpoints" / "step-00000002" / "trainable.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:100])  # truncated
    assert main(["export", str(run_dir), str(tmp_path / "b")]) == 1
    one_line(capsys)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_prompt_file_that_is_not_utf8_names_the_file(tmp_path, capsys):
    bad = tmp_path / "prompts.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "caf\xe9"}\n')
    assert (
        main(bench_run_argv(bad, tmp_path / "r.jsonl", "--no-progress", system="s")) == 1
    )  # bad content: 1, as train --data
    assert "not valid JSON" in (line := one_line(capsys)) and "prompts.jsonl:1)" in line


def test_a_draft_without_architectures_is_refused_naming_the_field(tmp_path):
    from test_serving import draft_config, write_tiny_draft

    from sglang_lilicorr.checkpoint import read_config
    from sglang_lilicorr.drafter import DrafterConfig, load_draft
    from sglang_lilicorr.serving.draft_check import examine_draft

    config = draft_config()
    folder = write_tiny_draft(tmp_path / "d")
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    for load in (read_config, load_draft):
        with pytest.raises(CheckpointError, match="`architectures`=None"):
            load(folder)
    with pytest.raises(CheckpointError, match="`architectures`=None"):
        DrafterConfig.from_hf_config(config)
    (problem,) = examine_draft(folder).problems
    assert "`architectures`=None" in str(problem)
    config["architectures"] = "LiLiCorrDraftModel"  # a string, not a list
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="`architectures`='LiLiCorrDraftModel' is not"):
        load_draft(folder)


def test_a_bad_drafter_field_is_a_checkpoint_error(tmp_path):
    from test_serving import draft_config, write_tiny_draft

    from sglang_lilicorr.drafter import load_draft

    config = draft_config()
    config["dflash_config"]["target_layer_ids"] = [1, 9]  # past the 4-layer target
    with pytest.raises(CheckpointError, match=r"target_layer_ids \[9\] out of range"):
        load_draft(write_tiny_draft(tmp_path / "d", config=config))
    config["num_hidden_layers"] = "one"
    with pytest.raises(CheckpointError, match="num_hidden_layers='one' is not an integer"):
        load_draft(write_tiny_draft(tmp_path / "e", config=config))


def test_train_with_batch_size_0_is_one_line(tmp_path, capsys):
    from test_train import make_target, write_conversations

    target, data = make_target(tmp_path / "target"), write_conversations(tmp_path / "train.jsonl", 4)
    capsys.readouterr()
    code = main(
        [
            "train",
            "--target",
            target,
            "--data",
            data,
            "--output-dir",
            str(tmp_path / "run"),
            "--batch-size",
            "0",
            "--max-steps",
            "1",
            "--no-bf16",
        ]
    )
    err = capsys.readouterr().err  # progress bars of the model load may come first
    assert code in (1, 2) and err.splitlines()[-1].startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()
