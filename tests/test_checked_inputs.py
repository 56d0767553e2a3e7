"""What every command checks before it trusts a file, and how a user's mistake is answered: checkpoints carry their
checksum (older ones load only when asked, with a warning); every tensor of a checkpoint or draft is checked for
dtype, shape and finiteness on resume, export and check-draft alike; bad text and JSON of any depth name file:line;
a full disk is one line; a value the target cannot take is warned about and recorded as used; flags are named as
the user typed them."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_lilicorr import checkpoint
from sglang_lilicorr.checkpoint import read_config, save_tensors, write_checkpoint_files
from sglang_lilicorr.cli import main
from stub_server import StubServer, bench_run_argv
from test_export_safety import snapshot
from test_nothing_lost import error_line, metrics_rows, shaped, train_args
from test_train import make_target, write_conversations

SURROGATE = '{"role": "user", "content": "bad \\ud800 text"}'  # a JSON escape that is no character
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("checked")
    ws = {"target": make_target(root / "target"), "data": write_conversations(root / "data.jsonl", 8), "root": root}
    ws["run"] = root / "run"
    assert main(train_args(ws, ws["run"], "--max-steps", "2", "--keep-checkpoints", "1")) == 0
    return ws


def copy_run(ws, tmp_path) -> Path:
    return Path(shutil.copytree(ws["run"], tmp_path / "run"))


def weights_of(run: Path) -> Path:
    return run / "checkpoints" / "step-00000002" / "trainable.safetensors"


# --- checksums -------------------------------------------------------------------------------------------------


def test_a_checkpoint_without_its_checksum_is_refused_unless_legacy_ones_are_accepted(ws, tmp_path, capsys):
    run = copy_run(ws, tmp_path)
    save_file(load_file(str(weights_of(run))), str(weights_of(run)))  # the same tensors, no checksum in the metadata
    before = snapshot(run)
    capsys.readouterr()
    for argv in (train_args(ws, run, "--max-steps", "3"), ["export", str(run), str(tmp_path / "draft")]):
        assert main(argv) == 1
        line = error_line(capsys)
        assert shaped(line) and "carries no checksum" in line and "--accept-legacy-checkpoints" in line, line
    assert snapshot(run) == before and not (tmp_path / "draft").exists()
    assert main(["export", str(run), str(tmp_path / "draft"), "--accept-legacy-checkpoints"]) == 0
    assert "carries no checksum; loaded unchecked (--accept-legacy-checkpoints)" in capsys.readouterr().err
    assert main(train_args(ws, run, "--max-steps", "3", "--accept-legacy-checkpoints")) == 0
    assert "carries no checksum" in capsys.readouterr().err
    assert [json.loads(r)["step"] for r in metrics_rows(run)] == [1, 2, 3]


# --- every tensor: dtype, shape, finiteness ------------------------------------------------------------------


def head_tensor(tensors: dict) -> str:
    return next(k for k in sorted(tensors) if k.startswith("lilicorr.") and tensors[k].dim() == 2)


@pytest.mark.parametrize(
    "change,named",
    [
        (lambda t: t.__setitem__("fc.weight", t["fc.weight"].to(torch.int32)), "'fc.weight' is torch.int32"),
        (lambda t: t.__setitem__("fc.weight", t["fc.weight"].double()), "'fc.weight' is torch.float64"),
        (lambda t: t.__setitem__(head_tensor(t), t[head_tensor(t)].double()), "is torch.float64"),
        (lambda t: t.__setitem__("fc.weight", t["fc.weight"][:, :-1].contiguous()), "'fc.weight' has shape"),
        (lambda t: t[head_tensor(t)].__setitem__((0, 0), float("inf")), "holds NaN or Inf"),
    ],
    ids=["int32-drafter", "float64-drafter", "float64-head", "shape", "inf-head"],
)
def test_a_bad_tensor_with_a_good_checksum_is_refused_by_resume_and_export_alike(ws, tmp_path, capsys, change, named):
    run = copy_run(ws, tmp_path)
    tensors = load_file(str(weights_of(run)))
    change(tensors)
    save_tensors(weights_of(run), tensors)  # its checksum matches: only the tensor is wrong
    before = snapshot(run)
    capsys.readouterr()
    for argv in (train_args(ws, run, "--max-steps", "3"), ["export", str(run), str(tmp_path / "draft")]):
        assert main(argv) == 1
        line = error_line(capsys)
        assert shaped(line) and named in line and str(run) in line, line
    assert snapshot(run) == before and not (tmp_path / "draft").exists()


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.float32])
def test_check_draft_refuses_a_drafter_or_head_tensor_of_another_dtype(ws, tmp_path, capsys, dtype):
    draft = tmp_path / "draft"
    assert main(["export", str(ws["run"]), str(draft)]) == 0  # bfloat16
    tensors = load_file(str(draft / "model.safetensors"))
    name = "fc.weight" if dtype != torch.float32 else head_tensor(tensors)
    tensors[name] = tensors[name].to(dtype)
    write_checkpoint_files(draft, read_config(draft), tensors)
    capsys.readouterr()
    assert main(["check-draft", str(draft), "--target", ws["target"]]) == 1
    err = capsys.readouterr().err
    assert f"has dtype {dtype}, expected torch.bfloat16" in err and "this is a bug" not in err, err


def test_an_unknown_lilicorr_key_is_refused_with_the_closest_known_one(ws, tmp_path, capsys):
    from sglang_lilicorr.drafter import load_draft

    draft = tmp_path / "draft"
    assert main(["export", str(ws["run"]), str(draft)]) == 0
    config = json.loads((draft / "config.json").read_text())
    config["dflash_config"]["lilicorr_logit_scael"] = config["dflash_config"].pop("lilicorr_logit_scale")
    (draft / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["check-draft", str(draft), "--target", ws["target"]]) == 1
    assert "unknown key dflash_config.lilicorr_logit_scael (did you mean lilicorr_logit_scale?)" in (
        capsys.readouterr().err
    )
    with pytest.raises(checkpoint.CheckpointError, match="did you mean lilicorr_logit_scale"):
        load_draft(draft)


# --- bad text: lone surrogates, JSON of any depth ----------------------------------------------------------------


def with_bad_line(path: Path, good: str, bad: str) -> Path:
    """Two good lines (`good`, and `good` with its id "a" as "b"), then `bad` on line 3."""
    other = good.replace('"a"', '"b"')
    path.write_text(f"{good}\n{other}\n{bad}\n")
    return path


@pytest.mark.parametrize("bad", ["surrogate", "deep"])
def test_bad_text_in_training_data_names_its_line(ws, tmp_path, capsys, bad):
    good = Path(ws["data"]).read_text().splitlines()[0]
    text = {"surrogate": f'{{"messages": [{SURROGATE}]}}', "deep": f'{{"messages": {DEEP}}}'}[bad]
    data = with_bad_line(tmp_path / "data.jsonl", good, text)
    capsys.readouterr()
    assert main(train_args(ws, tmp_path / "run", "--max-steps", "1", data=str(data))) == 1
    line = error_line(capsys)
    assert shaped(line) and f"({data}:3)" in line, line
    assert ("lone UTF-16 surrogate \\ud800" if bad == "surrogate" else "nested deeper than") in line


def test_bad_text_in_prompts_names_its_line_before_anything_is_generated(ws, tmp_path, capsys):
    prompts = with_bad_line(
        tmp_path / "p.jsonl", '{"id": "a", "text": "hi"}', f'{{"id": "b", "messages": [{SURROGATE}]}}'
    )
    out = tmp_path / "out.jsonl"
    argv = ["regenerate", "--target", ws["target"], "--prompts", str(prompts), "--output", str(out)]
    capsys.readouterr()
    assert main([*argv, "--engine", "transformers", "--max-new-tokens", "2"]) == 1
    line = error_line(capsys)
    assert shaped(line) and f"({prompts}:3)" in line and "surrogate" in line, line
    assert not out.exists()


def test_bad_text_in_a_bench_dataset_names_its_line_before_anything_is_recorded(tmp_path, capsys):
    prompts = with_bad_line(
        tmp_path / "p.jsonl", '{"id": "a", "text": "hi"}', f'{{"id": "c", "messages": [{SURROGATE}]}}'
    )
    results = tmp_path / "results.jsonl"
    with StubServer() as server:
        capsys.readouterr()
        assert main(bench_run_argv(prompts, results, "--no-progress", url=server.url)) == 1
        assert not server.log
    line = error_line(capsys)
    assert shaped(line) and f"({prompts}:3)" in line and "surrogate" in line, line
    assert not results.exists()


def test_read_jsonl_names_any_depth_and_any_surrogate(tmp_path):
    from sglang_lilicorr.jsonl import DataError, read_jsonl

    for bad in (DEEP, '{"a": {"b": ["\\udfff"]}}', '{"\\ud800": 1}'):
        path = with_bad_line(tmp_path / "x.jsonl", '{"a": 1}', bad)
        with pytest.raises(DataError) as e:
            list(read_jsonl(path))
        assert e.value.where == f"{path}:3"
    assert [row for _, row in read_jsonl(with_bad_line(tmp_path / "y.jsonl", '{"a": "\\ud83d\\ude00"}', "{}"))][0] == {
        "a": "\U0001f600"
    }  # a surrogate pair is one character


# --- a full disk ---------------------------------------------------------------------------------------------


def fill_the_disk_at(monkeypatch, call: int) -> None:
    """The `call`-th safetensors file written finds no space left (safetensors' own error)."""
    from safetensors import SafetensorError

    real, calls = checkpoint.save_file, [0]

    def save_file_on_a_full_disk(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", save_file_on_a_full_disk)


def test_a_full_disk_during_a_save_is_one_line_and_the_last_checkpoint_stays(ws, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    fill_the_disk_at(monkeypatch, 3)  # snapshot 2, checkpoint 2, snapshot 4: full
    assert main(train_args(ws, run, "--max-steps", "4", "--eval-every", "2")) == 1
    err = capsys.readouterr().err
    last = err.split("\n")[-2]  # the error's own line: no progress bar before it on that line
    assert last.startswith("error: no space left on ") and f"({run}): free " in last, err
    assert last.endswith(" MB or choose another --output-dir") and "bug" not in err and "Traceback" not in err
    assert (run / "latest").read_text().strip() == "step-00000002" and not [p for p in run.rglob(".*tmp*")]
    monkeypatch.undo()
    assert main(train_args(ws, run, "--max-steps", "4", "--eval-every", "2")) == 0  # resumes from the whole one
    assert [json.loads(r)["step"] for r in metrics_rows(run)] == [1, 2, 3, 4]


def test_a_full_disk_during_an_export_keeps_the_old_draft(ws, tmp_path, capsys, monkeypatch):
    draft = tmp_path / "draft"
    assert main(["export", str(ws["run"]), str(draft), "--dtype", "float32"]) == 0
    before = snapshot(draft)
    fill_the_disk_at(monkeypatch, 1)
    capsys.readouterr()
    assert main(["export", str(ws["run"]), str(draft)]) == 1
    line = error_line(capsys)
    assert line.startswith("error: no space left on ") and line.endswith("MB or choose another OUT_DIR"), line
    assert snapshot(draft) == before and sorted(p.name for p in tmp_path.iterdir()) == ["draft"]


# --- values the target cannot take; flags by their names -----------------------------------------------------


def test_context_features_beyond_the_target_are_warned_and_recorded_as_used(ws, tmp_path, capsys):
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(train_args(ws, run, "--max-steps", "1", "--num-context-features", "99")) == 0
    assert "warning: --num-context-features 99: the target's 6 layers give at most 3" in capsys.readouterr().err
    state = json.loads((run / "checkpoints" / "step-00000001" / "train_state.json").read_text())
    assert (
        state["run"]["num_context_features"] == 3
        and len(state["drafter_config"]["dflash_config"]["target_layer_ids"]) == 3
    )


def test_head_and_objective_errors_name_the_flag(ws, tmp_path, capsys):
    assert main(train_args(ws, tmp_path / "run", "--head-hidden-size", "30", "--head-heads", "4")) == 2
    line = error_line(capsys)
    assert line.startswith("error: --head-hidden-size 30: expected a multiple of the number of heads (4) "), line
    assert "(--head-hidden-size)" in line and "LiLiCorrConfig" not in line
    assert not (tmp_path / "run").exists()


# --- export: destinations and sources that cannot work ----------------------------------------------------------


def test_export_refuses_an_empty_destination_and_one_under_a_file(ws, tmp_path, capsys, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    (here / "afile.txt").write_text("mine")
    capsys.readouterr()
    assert main(["export", str(ws["run"]), ""]) == 2
    line = error_line(capsys)
    assert shaped(line) and "out_dir: an empty path" in line, line  # refused as the command line is parsed
    assert main(["export", str(ws["run"]), "afile.txt/sub"]) == 2
    line = error_line(capsys)
    assert shaped(line) and f"{here / 'afile.txt'} is a file" in line and "(OUT_DIR)" in line, line
    assert sorted(p.name for p in here.iterdir()) == ["afile.txt"] and (here / "afile.txt").read_text() == "mine"


def test_export_of_a_run_whose_latest_is_missing_reads_its_newest_complete_checkpoint(ws, tmp_path, capsys):
    from sglang_lilicorr.drafter import load_draft

    run = copy_run(ws, tmp_path)
    (run / "latest").unlink()
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "draft")]) == 0
    assert f"{run / 'latest'} is missing; reading the newest complete checkpoint" in capsys.readouterr().err
    load_draft(tmp_path / "draft")


# --- bench run with nothing listening -------------------------------------------------------------------------


def test_bench_run_with_nothing_listening_says_so_in_one_line(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": "hi"}) + "\n" for i in range(5)))
    capsys.readouterr()
    assert main(bench_run_argv(prompts, tmp_path / "r.jsonl", "--no-progress", "--warmup", "0")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: nothing answers there") and shaped(err.strip()), err


def test_any_write_that_finds_the_device_full_is_one_error_naming_the_device(tmp_path):
    import errno

    from sglang_lilicorr.ownership import DiskFullError, space_for

    with pytest.raises(DiskFullError) as e:
        with space_for(tmp_path / "run", 5_000_000_000_000, "--output-dir"):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))
    assert e.value.what.startswith("no space left on ") and e.value.where == str(tmp_path / "run")
    assert e.value.fix.startswith("free ") and e.value.fix.endswith(" MB or choose another --output-dir")
    with pytest.raises(PermissionError):  # anything else passes through as it was
        with space_for(tmp_path, 1, "--output-dir"):
            raise PermissionError(errno.EACCES, "Permission denied")
