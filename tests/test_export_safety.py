"""`lilicorr export` writes only what it may replace: a new or empty folder or an earlier export;
a foreign folder only with --force, which writes the draft's two files beside what is there and deletes nothing;
never a training run, a folder inside one, a model folder, or the run it reads.
The runs here are written by train/state.py directly (no training), so each test takes a second."""
import json
from pathlib import Path

import pytest
import torch

from sglang_lilicorr.cli import main
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.drafter import DFlashDrafter, DrafterConfig, load_draft
from sglang_lilicorr.errors import UsageError
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.train.export import export_checkpoint
from sglang_lilicorr.train.state import save_training_checkpoint, trainable_tensors

DRAFTER = DrafterConfig(hidden_size=32, vocab_size=64, num_target_layers=4, target_layer_ids=(1, 2), mask_token_id=3,
                        num_attention_heads=4, num_key_value_heads=4, head_dim=8, intermediate_size=64, block_size=4)
HEAD = LiLiCorrConfig(block_size=4, candidate_topk=4, hidden_size=32, num_layers=1, num_heads=4, factor_dim=16)


def write_run(folder: Path, poison: bool = False) -> Path:
    """A training run as the trainer leaves it: checkpoints/step-2, `latest`, metrics.jsonl."""
    torch.manual_seed(0)
    drafter, head = DFlashDrafter(DRAFTER).state_dict(), LiLiCorrHead(HEAD, DRAFTER.hidden_size).state_dict()
    if poison:
        drafter["fc.weight"] = torch.full_like(drafter["fc.weight"], float("nan"))
    save_training_checkpoint(folder, 2, {"epoch": 0, "index": 2}, DRAFTER, HEAD, trainable_tensors(drafter, head), {})
    (folder / "metrics.jsonl").write_text('{"step": 2}\n')
    return folder


def snapshot(folder: Path) -> dict:
    """Every file under folder -> its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run")


def test_export_writes_a_new_or_empty_folder(run, tmp_path):
    assert load_draft(export_checkpoint(run, tmp_path / "new" / "draft"))[1] is not None
    (tmp_path / "empty").mkdir()
    assert load_draft(export_checkpoint(run, tmp_path / "empty"))[1] is not None


def test_export_replaces_an_earlier_export(run, tmp_path):
    out = export_checkpoint(run, tmp_path / "draft", dtype="float32")
    export_checkpoint(run, out, dtype="bfloat16")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left beside it


def test_a_foreign_folder_needs_force(run, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("keep me")
    with pytest.raises(UsageError, match=r"not empty and is not an earlier export, it holds \['ideas.txt'\].*--force"):
        export_checkpoint(run, notes)
    assert (notes / "ideas.txt").read_text() == "keep me"
    export_checkpoint(run, notes, force=True)
    assert sorted(p.name for p in notes.iterdir()) == ["config.json", "ideas.txt", "model.safetensors"]
    assert (notes / "ideas.txt").read_text() == "keep me"  # --force deletes nothing


def test_force_never_deletes_a_run_or_a_model_folder_it_holds(run, tmp_path, capsys):
    """Issue 40, case 1: `export RUN ws --force` where ws/ holds another training run, or is a model folder."""
    ws = tmp_path / "ws"
    write_run(ws / "other-run")
    (ws / "notes.txt").write_text("mine")
    before = snapshot(ws)
    assert main(["export", str(run), str(ws), "--force"]) == 0
    after = snapshot(ws)
    assert {k: v for k, v in after.items() if k in before} == before  # every file it held is as it was
    assert sorted(set(after) - set(before)) == ["config.json", "model.safetensors"]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(b"weights")
    before = snapshot(model)
    capsys.readouterr()
    assert main(["export", str(run), str(model), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "not a draft's" in err
    assert snapshot(model) == before


def test_export_into_the_current_folder_leaves_no_temporaries(run, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["export", str(run), "."]) == 0
    assert sorted(p.name for p in here.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "run"]
    assert main(["export", str(run), "."]) == 0  # over its own earlier export
    assert load_draft(here)[1] is not None


def test_an_export_with_a_foreign_file_beside_it_is_foreign(run, tmp_path):
    out = export_checkpoint(run, tmp_path / "draft")
    (out / "README.md").write_text("my notes")
    with pytest.raises(UsageError, match="not an earlier export"):
        export_checkpoint(run, out)
    assert (out / "README.md").read_text() == "my notes"


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("where", ["run", "checkpoints", "step", "inside", "parent", "other-run"])
def test_never_into_or_over_a_training_run(run, tmp_path, where, force):
    other = write_run(tmp_path / "other")
    out = {"run": run, "checkpoints": run / "checkpoints", "step": run / "checkpoints" / "step-00000002",
           "inside": run / "draft", "parent": tmp_path, "other-run": other}[where]
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="training run|contains the checkpoint"):
        export_checkpoint(run, out, force=force)
    assert snapshot(tmp_path) == before


def test_from_a_step_folder_never_over_its_run(run):
    step = run / "checkpoints" / "step-00000002"
    before = snapshot(run)
    for out in (run, step, run / "checkpoints"):
        with pytest.raises(UsageError):
            export_checkpoint(step, out, force=True)
    assert snapshot(run) == before


def test_a_failed_export_leaves_the_earlier_one(tmp_path):
    good, bad = write_run(tmp_path / "good"), write_run(tmp_path / "bad", poison=True)
    out = export_checkpoint(good, tmp_path / "draft")
    before = snapshot(out)
    with pytest.raises(Exception, match="NaN"):
        export_checkpoint(bad, out)
    assert snapshot(out) == before


def test_cli_export_run_run_is_one_line_and_keeps_every_checkpoint(run, capsys):
    before = snapshot(run)
    assert main(["export", str(run), str(run), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "contains the checkpoint" in err
    assert snapshot(run) == before


def test_cli_export_into_a_foreign_folder_names_force(run, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    assert main(["export", str(run), str(tmp_path / "notes")]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "notes"), "--force"]) == 0
    assert load_draft(tmp_path / "notes")[1] is not None and (tmp_path / "notes" / "a.txt").read_text() == "x"


def test_check_destination_needs_force_by_default(run, tmp_path):
    from sglang_lilicorr.train.export import check_destination

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("x")
    with pytest.raises(UsageError, match="--force"):
        check_destination(notes, run)
    assert check_destination(notes, run, force=True) == "existing"
    assert check_destination(tmp_path / "new", run) == "new"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_destination(tmp_path / "file", run)


@pytest.mark.parametrize("where", ["run", "step", "inside"])
def test_a_run_and_a_folder_inside_one_are_told_apart(run, where):
    from sglang_lilicorr.train.export import check_destination

    other = write_run(run.parent / "other")
    out = {"run": other, "step": other / "checkpoints" / "step-00000002", "inside": other / "draft"}[where]
    with pytest.raises(UsageError) as e:
        check_destination(out, run)
    assert e.value.where == "OUT_DIR"
    assert e.value.what == (f"{out} is inside a training run or checkpoint, {other}" if where == "inside"
                            else f"{out} is a training run or checkpoint")


@pytest.mark.parametrize("kind, found", [("missing", "not an existing folder"), ("plain", "not a training run or checkpoint"),
                                         ("draft", "a draft, not a training run")])
def test_each_source_that_is_not_a_run_is_named(run, tmp_path, kind, found):
    source = {"missing": tmp_path / "nowhere", "plain": tmp_path / "plain", "draft": tmp_path / "draft"}[kind]
    if kind == "plain":
        source.mkdir()
        (source / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    if kind == "draft":
        export_checkpoint(run, source)
    with pytest.raises(UsageError) as e:
        export_checkpoint(source, tmp_path / "out")
    assert e.value.exit_code == 2 and e.value.where == "CHECKPOINT" and e.value.what == f"{str(source)!r} is {found}"


def rewrite_tensors(run: Path, change) -> None:
    from sglang_lilicorr.checkpoint import load_tensors, save_tensors

    path = run / "checkpoints" / "step-00000002" / "trainable.safetensors"
    tensors = load_tensors(path, fix="")
    change(tensors)
    save_tensors(path, tensors)  # with its checksum: only the head is wrong


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("lilicorr.in_head.weight"), "missing tensor 'in_head.weight'"),
    (lambda t: t.__setitem__("lilicorr.extra", torch.zeros(2)), "unexpected tensor 'extra'"),
    (lambda t: t.__setitem__("lilicorr.same_slot_bias", torch.zeros(3)), r"'same_slot_bias' has shape \(3,\), expected \(4,\)"),
])
def test_a_head_that_does_not_match_its_config_is_a_checkpoint_error(run, tmp_path, change, message):
    """Found by mutation testing: the head was loaded with load_state_dict, whose RuntimeError `lilicorr` reported as a
    bug; it is now checked like the drafter, tensor by tensor, and nothing is written."""
    from sglang_lilicorr.checkpoint import CheckpointError

    rewrite_tensors(run, change)
    with pytest.raises(CheckpointError, match=message):
        export_checkpoint(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_head_tensors_without_a_head_config_are_refused(run, tmp_path):
    from sglang_lilicorr.checkpoint import CheckpointError

    meta_path = run / "checkpoints" / "step-00000002" / "train_state.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "head_config": None}))
    with pytest.raises(CheckpointError, match="holds head tensors but no head config"):
        export_checkpoint(run, tmp_path / "out")
    rewrite_tensors(run, lambda t: [t.pop(k) for k in [k for k in t if k.startswith("lilicorr.")]])
    draft = export_checkpoint(run, tmp_path / "out")  # a drafter alone: a vanilla DFlash draft
    assert load_draft(draft)[1] is None
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
