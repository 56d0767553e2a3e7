"""train/state.py directly (no training, tiny tensors: fast): the checkpoint files and their round trip, `latest`,
the fallback of resume_point past checkpoints that do not load, the checkpoints set aside or pruned, the metrics
trimmed on resume, and each refusal of a checkpoint that does not match the run (its own test)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sglang_lilicorr.checkpoint import CheckpointError
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.drafter import DFlashDrafter, DrafterConfig
from sglang_lilicorr.drafter.config import RopeScaling
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.ownership import temporary_name
from sglang_lilicorr.train import state
from sglang_lilicorr.train.export import export_checkpoint

DRAFTER = DrafterConfig(
    hidden_size=32,
    vocab_size=64,
    num_target_layers=4,
    target_layer_ids=(1, 2),
    mask_token_id=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=8,
    intermediate_size=64,
    block_size=4,
)
HEAD = LiLiCorrConfig(block_size=4, candidate_topk=4, hidden_size=32, num_layers=1, num_heads=4, factor_dim=16)
OPTIMIZER = {"optimizer": {"state": {}, "param_groups": [{"lr": 0.5}]}, "scheduler": {"last_epoch": 3}}


def tensors(seed: int = 0, head: bool = True) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    h = LiLiCorrHead(HEAD, DRAFTER.hidden_size).state_dict() if head else None
    return state.trainable_tensors(DFlashDrafter(DRAFTER).state_dict(), h)


def save(run: Path, step: int, seed: int = 0, run_identity=None, optimizer=OPTIMIZER, head=HEAD) -> Path:
    return state.save_training_checkpoint(
        run, step, {"epoch": 1, "index": step}, DRAFTER, head, tensors(seed, head is not None), optimizer, run_identity
    )


def test_a_checkpoint_round_trips_exactly(tmp_path):
    saved = tensors(3)
    bf16 = {k: v.to(torch.bfloat16) for k, v in saved.items()}
    path = state.save_training_checkpoint(
        tmp_path, 7, {"epoch": 1, "index": 7}, DRAFTER, HEAD, bf16, OPTIMIZER, {"lr": 0.5}
    )
    assert path == tmp_path / "checkpoints" / "step-00000007"
    assert sorted(p.name for p in path.iterdir()) == [state.OPTIMIZER_FILE, state.STATE_FILE, state.TENSORS_FILE]
    assert (tmp_path / state.LATEST).read_text() == "step-00000007\n"
    got_state, drafter, head, got = state.read_training_checkpoint(tmp_path)  # the run folder: through `latest`
    assert (got_state["format"], got_state["step"], got_state["progress"], got_state["run"]) == (
        state.FORMAT,
        7,
        {"epoch": 1, "index": 7},
        {"lr": 0.5},
    )
    assert drafter == DRAFTER and head == HEAD
    assert set(got) == set(saved) and all(got[k].dtype == torch.float32 for k in got)  # fp32 masters on disk
    assert all(torch.equal(got[k], bf16[k].float()) for k in got)
    assert any(k.startswith("lilicorr.") for k in got)
    assert state.read_optimizer_state(path) == OPTIMIZER


def test_latest_moves_to_the_newest_and_complete_checkpoints_are_newest_first(tmp_path):
    assert state.latest_checkpoint(tmp_path) is None and state.complete_checkpoints(tmp_path) == []
    a = save(tmp_path, 2)
    b = save(tmp_path, 10)
    (tmp_path / "checkpoints" / "step-00000011").mkdir()  # no state file: not complete
    (tmp_path / "checkpoints" / "step-00000012").write_text("a file")
    assert state.latest_checkpoint(tmp_path) == b
    assert state.complete_checkpoints(tmp_path) == [b, a]
    state.point_latest(tmp_path, a)
    assert state.latest_checkpoint(tmp_path) == a and (tmp_path / state.LATEST).read_text() == "step-00000002\n"
    before = (tmp_path / state.LATEST).stat().st_mtime_ns
    state.point_latest(tmp_path, a)  # already names it: left alone
    assert (tmp_path / state.LATEST).stat().st_mtime_ns == before


def test_latest_naming_an_incomplete_checkpoint_is_refused(tmp_path):
    save(tmp_path, 2)
    (tmp_path / state.LATEST).write_text("step-00000009\n")
    with pytest.raises(CheckpointError, match="`latest` names step-00000009, which is not a complete"):
        state.latest_checkpoint(tmp_path)


def test_the_orphans_of_a_killed_save_are_removed(tmp_path):
    keep = save(tmp_path, 2)
    (tmp_path / "snapshots").mkdir()
    made = [
        temporary_name(tmp_path / "checkpoints" / "step-00000004"),
        temporary_name(tmp_path / "snapshots" / "s"),
        temporary_name(tmp_path / "checkpoints" / "x"),
    ]  # a name no legacy pattern matches
    made[0].mkdir()
    made[1].write_text("x")
    made[2].write_text("x")
    legacy = [
        tmp_path / "checkpoints" / ".step-00000006",
        tmp_path / "snapshots" / ".step-00000006.safetensors.tmp",
        tmp_path / ".latest.tmp",
        tmp_path / ".metrics.jsonl.tmp",
    ]
    legacy[0].mkdir()
    for p in legacy[1:]:
        p.write_text("x")
    removed = state.remove_orphans(tmp_path)
    assert sorted(removed) == sorted(made + legacy) and not any(p.exists() for p in made + legacy)
    assert keep.is_dir() and (tmp_path / state.LATEST).is_file()
    assert state.remove_orphans(tmp_path) == []


def corrupt(path: Path) -> None:
    (path / state.OPTIMIZER_FILE).write_bytes(b"changed")


def test_resume_takes_the_newest_checkpoint_that_loads(tmp_path):
    assert state.resume_point(tmp_path) is None
    save(tmp_path, 2, seed=1)
    three = save(tmp_path, 3, seed=2)
    four = save(tmp_path, 4, seed=3)
    corrupt(four)
    warnings = []
    path, (got_state, _, _, got), optimizer = state.resume_point(tmp_path, warn=warnings.append)
    assert path == three and got_state["step"] == 3 and optimizer == OPTIMIZER
    assert torch.equal(got["fc.weight"], tensors(2)["fc.weight"])
    assert len(warnings) == 1 and "Falling back to the checkpoint before it, step-00000003." in warnings[0]
    assert state.set_aside_newer(tmp_path, three) == [tmp_path / "checkpoints" / "bad-step-00000004"]
    assert state.complete_checkpoints(tmp_path)[0] == three


def test_resume_stops_when_no_checkpoint_loads(tmp_path):
    for step in (2, 3):
        corrupt(save(tmp_path, step))
    warnings = []
    with pytest.raises(
        CheckpointError, match=r"no checkpoint of this run loads \(2 tried; .*optimizer.pt: does not match"
    ):
        state.resume_point(tmp_path, warn=warnings.append)
    assert len(warnings) == 1 and "step-00000002" in warnings[0]
    assert len(state.complete_checkpoints(tmp_path)) == 2  # nothing removed


def test_each_bad_optimizer_state_is_refused(tmp_path):
    path = save(tmp_path, 2)
    corrupt(path)
    with pytest.raises(CheckpointError, match="does not match the sha256 in train_state.json"):
        state.read_optimizer_state(path)
    path = save(tmp_path, 3, optimizer={"optimizer": {}})
    with pytest.raises(CheckpointError, match="holds no optimizer and scheduler state"):
        state.read_optimizer_state(path)
    path = save(tmp_path, 4)
    meta = json.loads((path / state.STATE_FILE).read_text())
    del meta["sha256"]  # written before the checksum: refused, or read unchecked when legacy ones are accepted
    (path / state.STATE_FILE).write_text(json.dumps(meta))
    (path / state.OPTIMIZER_FILE).write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="has no sha256 in train_state.json.*--accept-legacy-checkpoints"):
        state.read_optimizer_state(path)
    with pytest.raises(CheckpointError, match="truncated or not an optimizer state"):
        state.read_optimizer_state(path, legacy=True)
    (path / state.OPTIMIZER_FILE).unlink()
    with pytest.raises(CheckpointError, match="cannot be read"):
        state.read_optimizer_state(path)


def test_set_aside_keeps_every_newer_checkpoint_under_a_free_name(tmp_path):
    two, three, four = save(tmp_path, 2), save(tmp_path, 3), save(tmp_path, 4)
    (tmp_path / "checkpoints" / "bad-step-00000003").mkdir()
    (tmp_path / "checkpoints" / "bad-step-00000003.1").mkdir()
    moved = state.set_aside_newer(tmp_path, two)
    assert sorted(p.name for p in moved) == ["bad-step-00000003.2", "bad-step-00000004"]
    assert state.complete_checkpoints(tmp_path) == [two] and not three.exists() and not four.exists()
    assert state.set_aside_newer(tmp_path, two) == []


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_prune_keeps_the_newest(tmp_path, keep):
    paths = [save(tmp_path, s) for s in (2, 3, 4)]
    state.prune_checkpoints(tmp_path, keep)
    assert state.complete_checkpoints(tmp_path) == paths[::-1][:keep]


def test_a_snapshot_is_bf16(tmp_path):
    path = state.save_snapshot(tmp_path, 12, {"w": torch.tensor([1.0, 1.00390625, 3.0])})
    assert path == tmp_path / "snapshots" / "step-00000012.safetensors"
    got = load_file(str(path))["w"]
    assert got.dtype == torch.bfloat16 and got.tolist() == [1.0, 1.0, 3.0]


def test_trim_metrics_keeps_the_rows_up_to_the_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    state.trim_metrics(path, 3)
    assert not path.exists()
    path.write_text(
        '{"step": 1}\n{"step": 2, "loss": 1}\n[1]\n{"step": "3"}\n{"step": 3}\n{"step": 4}\n{"step": 3}\n{"step"'
    )
    state.trim_metrics(path, 3)
    assert path.read_text() == '{"step": 1}\n{"step": 2, "loss": 1}\n{"step": 3}\n{"step": 3}\n'
    path.write_text('{"step": 1}\n{"step": 2}')  # a last line without its newline, kept
    state.trim_metrics(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    state.trim_metrics(path, 0)
    assert path.read_text() == ""


def test_each_bad_training_checkpoint_is_refused(tmp_path):
    path = save(tmp_path, 2)
    meta = json.loads((path / state.STATE_FILE).read_text())

    def rewritten(**changes):
        (path / state.STATE_FILE).write_text(json.dumps({**meta, **changes}))
        return path

    with pytest.raises(CheckpointError, match="format 'other', expected 'lilicorr-train-v1'"):
        state.read_training_checkpoint(rewritten(format="other"))
    (path / state.STATE_FILE).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"format \[1, 2\], expected"):
        state.read_training_checkpoint(path)
    for key in ("step", "drafter_config", "head_config"):
        (path / state.STATE_FILE).write_text(json.dumps({k: v for k, v in meta.items() if k != key}))
        with pytest.raises(CheckpointError, match=rf"lacks \['{key}'\]"):
            state.read_training_checkpoint(path)
    with pytest.raises(CheckpointError, match="drafter_config / head_config"):
        state.read_training_checkpoint(rewritten(drafter_config={"hidden_size": 32}))
    (path / state.STATE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        state.read_training_checkpoint(path)
    rewritten()
    bad = tensors()
    bad["lilicorr.same_slot_bias"] = torch.full_like(bad["lilicorr.same_slot_bias"], float("inf"))
    from sglang_lilicorr.checkpoint import save_tensors

    save_tensors(path / state.TENSORS_FILE, bad)
    with pytest.raises(CheckpointError, match="tensor 'lilicorr.same_slot_bias' holds NaN or Inf"):
        state.read_training_checkpoint(path)


def test_a_checkpoint_without_a_head(tmp_path):
    path = save(tmp_path, 2, head=None)
    got_state, _, head, got = state.read_training_checkpoint(path)
    assert got_state["head_config"] is None and head is None and not any(k.startswith("lilicorr.") for k in got)
    assert state.head_config_from_keys(None, DRAFTER) is None
    assert state.head_config_from_keys(HEAD.to_dflash_keys(), DRAFTER) == HEAD


def test_resume_compares_the_run(tmp_path):
    run = {"data": "a.jsonl", "lr": 0.001, "seed": 0, "gamma": 1.0, "steps": 100}
    got_state = state.read_training_checkpoint(save(tmp_path, 2, run_identity=run))[0]
    state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", run)
    state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", None)  # nothing to compare
    state.check_resume_compatible({**got_state, "run": None}, DRAFTER, HEAD, "w", {"lr": 9})  # saved before `run`
    with pytest.raises(
        state.IncompatibleCheckpointError, match=r"this run's \['lr'\] differ .*\(lr: 0.001 -> 0.002\) \(w\)"
    ) as e:
        state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", {**run, "lr": 0.002})
    assert e.value.exit_code == 2 and e.value.where == "w" and "--resume-with-changes" in e.value.fix
    more = {**run, "lr": 0.002, "seed": 1, "steps": 5, "gamma": 2.0}
    with pytest.raises(
        state.IncompatibleCheckpointError,
        match=r"\['gamma', 'lr', 'seed', 'steps'\] differ .*"
        r"\(gamma: 1.0 -> 2.0, lr: 0.001 -> 0.002, seed: 0 -> 1, ...\)",
    ):
        state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", more)
    with pytest.raises(state.IncompatibleCheckpointError, match=r"\['new'\] differ .*\(new: null -> 1\)"):
        state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", {**run, "new": 1})
    long = "x" * 50
    with pytest.raises(state.IncompatibleCheckpointError, match=rf'data: "a.jsonl" -> "{"x" * 36}\.\.\.\)'):
        state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", {**run, "data": long})
    assert state._short("x" * 38) == '"' + "x" * 38 + '"' and state._short("x" * 39) == '"' + "x" * 36 + "..."


def test_resume_refuses_another_geometry(tmp_path):
    got_state = state.read_training_checkpoint(save(tmp_path, 2))[0]
    wider = dataclasses.replace(DRAFTER, intermediate_size=128)
    with pytest.raises(
        state.IncompatibleCheckpointError,
        match=r"cannot resume, the drafter differs in \['intermediate_size'\] "
        r"\(checkpoint \[64\] vs this run \[128\]\)",
    ):
        state.check_resume_compatible(got_state, wider, HEAD, "w")
    with pytest.raises(state.IncompatibleCheckpointError, match="cannot resume, the head differs"):
        state.check_resume_compatible(got_state, DRAFTER, dataclasses.replace(HEAD, factor_dim=8), "w")
    with pytest.raises(state.IncompatibleCheckpointError, match=r"head differs \(checkpoint \{.*\}, this run None\)"):
        state.check_resume_compatible(got_state, DRAFTER, None, "w")
    yarn = dataclasses.replace(DRAFTER, rope_scaling=RopeScaling("yarn", 4.0, 32768))
    with pytest.raises(state.IncompatibleCheckpointError, match=r"differs in \['rope_scaling'\]"):
        state.check_resume_compatible(got_state, yarn, HEAD, "w")
    state.check_same_geometry(
        got_state["drafter_config"], got_state["head_config"], yarn, HEAD, "w", "start", rope_may_differ=True
    )


def test_a_run_starts_from_an_export(tmp_path):
    save(tmp_path / "run", 2, seed=4)
    draft = export_checkpoint(tmp_path / "run", tmp_path / "draft", dtype="bfloat16")
    drafter, head = DFlashDrafter(DRAFTER), LiLiCorrHead(HEAD, DRAFTER.hidden_size)
    state.load_draft_weights(draft, drafter, head, DRAFTER, HEAD)
    want = tensors(4)
    assert head.same_slot_bias.dtype == torch.float32  # fp32 masters from a bf16 draft
    assert all(torch.equal(v, want["lilicorr." + k].to(torch.bfloat16).float()) for k, v in head.state_dict().items())
    assert torch.equal(drafter.state_dict()["fc.weight"], want["fc.weight"].to(torch.bfloat16).float())
    with pytest.raises(state.IncompatibleCheckpointError, match="cannot start from it, the head differs"):
        state.load_draft_weights(draft, drafter, None, DRAFTER, None)
    save(tmp_path / "plain", 2, head=None)
    plain = export_checkpoint(tmp_path / "plain", tmp_path / "plain-draft")
    state.load_draft_weights(plain, drafter, None, DRAFTER, None)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    state.load_draft_weights(plain, drafter, head, DRAFTER, HEAD)  # a head-less DFlash draft: the head starts fresh
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())


def test_a_folder_that_is_neither_a_run_nor_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        state.read_training_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        state.read_training_checkpoint(tmp_path / "nowhere")


def test_a_yarn_run_starts_from_a_plain_rope_draft(tmp_path):
    """The paper's extension to long inputs: the rope's scaling shapes no tensor, so --init-from takes a draft of
    another rope; a resume does not (test_resume_refuses_another_geometry)."""
    save(tmp_path / "run", 2, seed=5)
    draft = export_checkpoint(tmp_path / "run", tmp_path / "draft", dtype="float32")
    yarn = dataclasses.replace(DRAFTER, rope_scaling=RopeScaling("yarn", 4.0, 32768))
    drafter, head = DFlashDrafter(yarn), LiLiCorrHead(HEAD, DRAFTER.hidden_size)
    state.load_draft_weights(draft, drafter, head, yarn, HEAD)
    assert torch.equal(drafter.state_dict()["fc.weight"], tensors(5)["fc.weight"])


def test_an_optimizer_state_holding_other_objects_is_not_unpickled(tmp_path):
    """optimizer.pt is loaded with weights_only: a pickle of anything but tensors and plain containers (which could run
    code when loaded) is refused, even with a matching sha256."""
    from pathlib import PurePosixPath

    path = save(tmp_path, 2, optimizer={"optimizer": {}, "scheduler": PurePosixPath("/x")})
    with pytest.raises(CheckpointError, match="truncated or not an optimizer state"):
        state.read_optimizer_state(path)


def test_prune_goes_on_past_a_checkpoint_that_vanished(tmp_path, monkeypatch):
    """A checkpoint removed meanwhile (by hand, or by another process) does not stop the training that prunes."""
    paths = [save(tmp_path, s) for s in (2, 3, 4)]
    listed = state.complete_checkpoints(tmp_path)
    shutil.rmtree(paths[0])
    monkeypatch.setattr(state, "complete_checkpoints", lambda output_dir: listed)
    state.prune_checkpoints(tmp_path, 1)
    assert not paths[1].exists() and paths[2].is_dir()


# --- what mutation testing found untested: the files' form, each refusal in full, corrector drafts, map_location ---


def refusal(call) -> CheckpointError:
    with pytest.raises(CheckpointError) as refused:
        call()
    return refused.value


EARLIER = "use an earlier checkpoint"


def test_the_state_file_is_indented_json(tmp_path):
    path = save(tmp_path, 2)
    text = (path / state.STATE_FILE).read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"


def test_each_checkpoint_refusal_in_full(tmp_path):
    path = save(tmp_path, 2)
    (tmp_path / state.LATEST).write_text("step-00000009\n")
    assert str(refusal(lambda: state.latest_checkpoint(tmp_path))) == (
        f"`latest` names step-00000009, which is not a complete training checkpoint ({tmp_path / state.LATEST}): "
        "pass OUTPUT/checkpoints/step-N of a complete one"
    )
    meta_path = path / state.STATE_FILE
    meta = json.loads(meta_path.read_text())
    e = refusal(lambda: state.read_training_checkpoint(tmp_path / "nowhere"))
    assert e.what.startswith("not a training checkpoint (") and (e.where, e.fix) == (
        str(tmp_path / "nowhere"),
        "pass OUTPUT or OUTPUT/checkpoints/step-N",
    )
    for changed, what, fix in (
        (
            {**meta, "format": "x"},
            "format 'x', expected 'lilicorr-train-v1'",
            "pass a checkpoint written by `lilicorr train`",
        ),
        (
            {k: v for k, v in meta.items() if k != "step"},
            "lacks ['step']",
            "it was not written by `lilicorr train` (or was cut short): use an earlier checkpoint",
        ),
    ):
        meta_path.write_text(json.dumps(changed))
        assert str(refusal(lambda: state.read_training_checkpoint(path))) == f"{what} ({meta_path}): {fix}"
    meta_path.write_text(json.dumps({**meta, "drafter_config": {"hidden_size": 32}}))
    e = refusal(lambda: state.read_training_checkpoint(path))
    assert e.what.startswith("drafter_config / head_config: ") and (e.where, e.fix) == (str(meta_path), EARLIER)
    meta_path.write_text(json.dumps(meta))
    (path / state.TENSORS_FILE).write_bytes(b"garbage")
    assert (
        refusal(lambda: state.read_training_checkpoint(path)).fix
        == "use an earlier checkpoint (OUTPUT/checkpoints/step-N)"
    )


def test_each_optimizer_refusal_in_full(tmp_path):
    path = save(tmp_path, 2)
    where = path / state.OPTIMIZER_FILE
    corrupt(path)
    assert str(refusal(lambda: state.read_optimizer_state(path))) == (
        f"does not match the sha256 in train_state.json: it changed after it was written ({where}): {EARLIER}"
    )
    path = save(tmp_path, 3, optimizer={"optimizer": {}})
    where = path / state.OPTIMIZER_FILE
    assert str(refusal(lambda: state.read_optimizer_state(path))) == (
        f"holds no optimizer and scheduler state ({where}): {EARLIER}"
    )
    meta = json.loads((path / state.STATE_FILE).read_text())
    del meta["sha256"]
    (path / state.STATE_FILE).write_text(json.dumps(meta))
    where.write_bytes(b"not a pickle")
    assert str(refusal(lambda: state.read_optimizer_state(path, legacy=True))) == (
        f"truncated or not an optimizer state (UnpicklingError) ({where}): {EARLIER}"
    )
    assert str(refusal(lambda: state.read_optimizer_state(path))) == (
        f"has no sha256 in train_state.json: written before checkpoints carried checksums, or not by lilicorr "
        f"({where}): pass --accept-legacy-checkpoints to load it without one (said with a warning), or use a "
        "checkpoint that has one"
    )
    where.unlink()
    e = refusal(lambda: state.read_optimizer_state(path))
    assert e.what.startswith("cannot be read (") and (e.where, e.fix) == (str(where), EARLIER)
    for step in (2, 3):
        shutil.rmtree(tmp_path / "checkpoints" / f"step-0000000{step}")
    corrupt(save(tmp_path, 4))
    e = refusal(lambda: state.resume_point(tmp_path))
    assert (e.where, e.fix) == (
        str(tmp_path),
        "nothing was changed; pass --no-resume --move-aside to start a new run in this folder (the old one is moved "
        "beside it, whole), or a new --output-dir",
    )


def test_optimizer_tensors_load_where_asked(tmp_path):
    """On the CPU by default (a state saved from GPU tensors resumes anywhere), else at map_location."""
    saved = {"optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}, "param_groups": []}, "scheduler": {}}
    path = save(tmp_path, 2, optimizer=saved)
    assert state.read_optimizer_state(path)["optimizer"]["state"][0]["exp_avg"].device.type == "cpu"
    assert state.resume_point(tmp_path)[2]["optimizer"]["state"][0]["exp_avg"].device.type == "cpu"
    assert (
        state.resume_point(tmp_path, map_location="meta")[2]["optimizer"]["state"][0]["exp_avg"].device.type == "meta"
    )


def test_weights_only_holds_whatever_the_environment_says(tmp_path, monkeypatch):
    """torch.load's own default gives way to TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD; the explicit weights_only=True does
    not."""
    from pathlib import PurePosixPath

    path = save(tmp_path, 2, optimizer={"optimizer": {}, "scheduler": PurePosixPath("/x")})
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="truncated or not an optimizer state"):
        state.read_optimizer_state(path)


def test_the_first_set_aside_name_is_dot_1(tmp_path):
    two = save(tmp_path, 2)
    save(tmp_path, 3)
    (tmp_path / "checkpoints" / "bad-step-00000003").mkdir()
    assert state.set_aside_newer(tmp_path, two) == [tmp_path / "checkpoints" / "bad-step-00000003.1"]


def test_trim_metrics_keeps_utf8_and_passes_over_torn_bytes(tmp_path):
    """A row holding non-ASCII text is kept as it is, under any locale; a line torn inside a character is dropped."""
    from ascii_locale import run_in_ascii_locale

    path = tmp_path / "metrics.jsonl"
    path.write_bytes('{"step": 1, "data": "données"}\n{"step": 2, "x": "é'.encode()[:-1])
    state.trim_metrics(path, 5)
    assert path.read_text(encoding="utf-8") == '{"step": 1, "data": "données"}\n'
    code = "import sys; from sglang_lilicorr.train.state import trim_metrics; trim_metrics(sys.argv[1], 5)"
    out = run_in_ascii_locale(code, str(path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert path.read_text(encoding="utf-8") == '{"step": 1, "data": "données"}\n'


def test_trim_metrics_keeps_rows_as_written_past_a_bad_line(tmp_path):
    """A line that is not JSON in the middle is dropped and the rows after it kept, each ending in a newline."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\r\n{"st\n{"step": 2}\n{"step": 9}\n')
    state.trim_metrics(path, 5)
    assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n'


def test_each_geometry_refusal_in_full(tmp_path):
    got_state = state.read_training_checkpoint(save(tmp_path, 2))[0]
    e = refusal(
        lambda: state.check_resume_compatible(got_state, dataclasses.replace(DRAFTER, intermediate_size=128), HEAD, "w")
    )
    assert (e.where, e.fix) == ("w", "use the same settings or a new --output-dir")
    e = refusal(lambda: state.check_resume_compatible(got_state, DRAFTER, None, "w"))
    assert (e.where, e.fix) == (
        "w",
        "use the same --head and head settings (gamma = 0 and --head none have none) or a new --output-dir",
    )
    run = {"a": 1, "b": 2, "c": 3}
    got_state = {**got_state, "run": run}
    e = refusal(lambda: state.check_resume_compatible(got_state, DRAFTER, HEAD, "w", {"a": 0, "b": 0, "c": 0}))
    assert (
        e.what
        == "cannot resume: this run's ['a', 'b', 'c'] differ from the checkpoint's (a: 1 -> 0, b: 2 -> 0, c: 3 -> 0)"
    )
    assert (
        e.fix == "pass the run's own --data and settings, a new --output-dir, or --resume-with-changes to continue "
        "this run with the new ones"
    )


def test_each_init_from_refusal_names_the_draft(tmp_path):
    from sglang_lilicorr.checkpoint import load_tensors, read_config, write_checkpoint_files

    save(tmp_path / "run", 2)
    draft = export_checkpoint(tmp_path / "run", tmp_path / "draft", dtype="float32")
    drafter, head = DFlashDrafter(DRAFTER), LiLiCorrHead(HEAD, DRAFTER.hidden_size)
    e = refusal(lambda: state.load_draft_weights(draft, drafter, None, DRAFTER, None))
    assert e.where == f"--init-from {draft}"
    weights = draft / "model.safetensors"
    original = load_tensors(weights, fix="")
    for part, change in (
        ("drafter", lambda t: t.pop("fc.weight")),
        ("head", lambda t: t.__setitem__("lilicorr.extra", torch.zeros(2))),
    ):
        tensors = dict(original)
        change(tensors)
        write_checkpoint_files(draft, read_config(draft), tensors)  # config and weights of one export
        e = refusal(lambda: state.load_draft_weights(draft, drafter, head, DRAFTER, HEAD))
        assert e.where == f"{weights} ({part})"


@pytest.mark.parametrize("kind", ["domino", "dspark"])
def test_a_run_starts_from_a_corrector_draft(tmp_path, kind):
    from sglang_lilicorr.baselines import DominoConfig, DSparkConfig
    from sglang_lilicorr.train.heads import build_head

    config = DominoConfig(gru_hidden_dim=8, emb_dim=16) if kind == "domino" else DSparkConfig(markov_rank=4)
    torch.manual_seed(6)
    saved_head = build_head(config, DRAFTER).state_dict()
    state.save_training_checkpoint(
        tmp_path / "run",
        2,
        {"epoch": 0, "index": 2},
        DRAFTER,
        config,
        state.trainable_tensors(DFlashDrafter(DRAFTER).state_dict(), saved_head),
        OPTIMIZER,
    )
    draft = export_checkpoint(tmp_path / "run", tmp_path / "draft", dtype="float32")
    drafter, head = DFlashDrafter(DRAFTER), build_head(config, DRAFTER)
    state.load_draft_weights(draft, drafter, head, DRAFTER, config)
    assert all(torch.equal(v, saved_head[k]) for k, v in head.state_dict().items())
    other = DominoConfig(gru_hidden_dim=4, emb_dim=16) if kind == "domino" else DSparkConfig(markov_rank=2)
    with pytest.raises(state.IncompatibleCheckpointError, match="cannot start from it, the head differs"):
        state.load_draft_weights(draft, drafter, build_head(other, DRAFTER), DRAFTER, other)
