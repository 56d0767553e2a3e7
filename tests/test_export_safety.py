"""`lilicorr export` writes only what it may replace: a new or empty folder or an earlier export;
a foreign folder only with --force, which replaces the draft's two files and keeps everything else as it was (the
same files); never a training run, a folder inside one, a model folder, the run it reads, or the current folder.
The runs here are written by train/state.py directly (no training), so each test takes a second."""

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from sglang_lilicorr import ownership
from sglang_lilicorr.cli import main
from sglang_lilicorr.drafter import DFlashDrafter, load_draft
from sglang_lilicorr.errors import UsageError
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.train.export import export_checkpoint
from sglang_lilicorr.train.state import save_training_checkpoint, trainable_tensors
from test_train_state import DRAFTER, HEAD


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


DRAFT = ("config.json", "model.safetensors")


def tree(folder: Path, but=DRAFT) -> dict:
    """Every entry under folder, itself included, but the top-level names `but` -> (its mode, its bytes, a symlink's
    target, or None for a folder)."""
    found = {}
    for top, folders, files in os.walk(folder):
        for name in [".", *folders, *files] if top == str(folder) else [*folders, *files]:
            path = Path(top) / name
            key = os.path.normpath(path.relative_to(folder))
            if key not in but:
                content = os.readlink(path) if path.is_symlink() else None if path.is_dir() else path.read_bytes()
                found[key] = (stat.S_IMODE(path.lstat().st_mode), content)
    return found


def users_folder(folder: Path) -> Path:
    """`folder` (made if need be) given what a user keeps: files of several modes, a hidden one, folders (an empty one,
    a private one, one two deep), symlinks (to a file, to a folder, to nothing)."""
    for name in ("sub/deeper", "empty", "private"):
        (folder / name).mkdir(parents=True)
    files = [("notes.txt", 0o600), (".hidden", 0o644), ("run.sh", 0o755), ("ro.txt", 0o444), ("sub/data.bin", 0o640)]
    for name, mode in [*files, ("sub/deeper/x", 0o644), ("private/key", 0o400)]:
        (folder / name).write_bytes(name.encode() + bytes(range(256)))
        (folder / name).chmod(mode)
    for name, mode in (("private", 0o700), ("sub", 0o750), (".", 0o750)):
        (folder / name).chmod(mode)
    (folder / "link").symlink_to("notes.txt")
    (folder / "sub-link").symlink_to("sub")
    (folder / "dangling").symlink_to("nowhere")
    return folder


def inodes(folder: Path) -> dict:
    """Each file and symlink under folder (but the draft's) -> its inode: the same file, not a copy, while it is."""
    return {k: os.lstat(folder / k).st_ino for k, (_, content) in tree(folder).items() if content is not None}


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
    """`export RUN ws --force` where ws/ holds another training run, or is a model folder."""
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


@pytest.mark.parametrize("where", ["here", "above"])
def test_never_into_the_current_folder_or_one_that_holds_it(run, tmp_path, monkeypatch, capsys, where):
    """A new folder takes the draft folder's place: the shell standing in it would be left in the old one."""
    here = export_checkpoint(run, tmp_path / "draft")
    (here / "sub").mkdir()
    monkeypatch.chdir(here if where == "here" else here / "sub")
    before = tree(here, but=())
    out = "." if where == "here" else ".."
    assert main(["export", str(run), out, "--force"]) == 2
    assert capsys.readouterr().err == (
        f"error: {out} is {'the current folder' if where == 'here' else 'a folder that holds the current one'}, which "
        f"an export replaces with a new folder (your shell would stay in the old one) (OUT_DIR): pass it from "
        f"outside: cd {tmp_path} and export to draft\n"
    )
    assert tree(here, but=()) == before and sorted(os.listdir(tmp_path)) == ["draft", "run"]
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(run), "draft", "--force"]) == 0  # from outside, as the line says


def test_force_keeps_every_other_file_and_folder_as_it_was(run, tmp_path):
    """--force over a user's folder, then over the draft it left there: the user's files are the same files (their
    inodes), with their modes and bytes; folders and symlinks as they were; the draft is the new one."""
    out = users_folder(tmp_path / "mine")
    before, files = tree(out), inodes(out)
    assert main(["export", str(run), str(out), "--force"]) == 0
    assert tree(out) == before and inodes(out) == files and load_draft(out)[1] is not None
    assert main(["export", str(run), str(out), "--force", "--dtype", "float32"]) == 0
    assert tree(out) == before and inodes(out) == files
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    assert sorted(os.listdir(tmp_path)) == ["mine", "run"]  # no temporary or lock beside it


def test_what_cannot_be_linked_is_refused_and_nothing_changes(run, tmp_path, monkeypatch, capsys):
    """A file on another file system than its folder's (or one the system will not link) is never copied: the
    export is refused, naming it, before anything changes."""
    out = users_folder(export_checkpoint(run, tmp_path / "mine"))
    before, draft = tree(out, but=()), snapshot(out)
    link = os.link

    def no_link_for_data(source, destination, **kwargs):
        if Path(source).name == "data.bin":
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        return link(source, destination, **kwargs)

    monkeypatch.setattr(os, "link", no_link_for_data)
    assert main(["export", str(run), str(out), "--force", "--dtype", "float32"]) == 2
    assert capsys.readouterr().err == (
        f"error: Invalid cross-device link: it cannot be kept as it is in a new copy of its folder "
        f"({out / 'sub' / 'data.bin'}): move it out of the folder (or make it writable), or write into a new or "
        "empty folder: a folder's other files are kept as hard links in its new copy, never copied\n"
    )
    assert tree(out, but=()) == before and snapshot(out) == draft and sorted(os.listdir(tmp_path)) == ["mine", "run"]


def test_a_folder_it_may_not_write_is_refused(run, tmp_path, monkeypatch, capsys):
    """Its old copy could not be emptied once the new one has taken its place."""
    out = users_folder(tmp_path / "mine")
    before = tree(out, but=())
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path).name != "sub" and access(path, mode))
    assert main(["export", str(run), str(out), "--force"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: a folder this user may not write: it cannot be kept as it is in a new copy of its folder "
        f"({out / 'sub'})"
    )
    assert tree(out, but=()) == before and sorted(os.listdir(tmp_path)) == ["mine", "run"]


def test_a_draft_folder_sheds_only_the_drafts_leftovers(run, tmp_path):
    """What a killed writer of the draft's files left in the folder goes; another writer's temporary stays."""
    out = users_folder(export_checkpoint(run, tmp_path / "mine"))
    (out / ".model.safetensors.lilicorr-tmp-1-aaaa").write_bytes(b"torn")
    (out / ".notes.txt.lilicorr-tmp-1-bbbb").write_text("another writer's")
    before = tree(out, but=(*DRAFT, ".model.safetensors.lilicorr-tmp-1-aaaa"))
    export_checkpoint(run, out, force=True)
    assert tree(out) == before


def test_files_written_during_an_export_are_kept(run, tmp_path, monkeypatch):
    """A file the user writes into the folder after its new copy was made, and one replaced by another file then: the
    old folder is emptied into the new one, never removed with them."""
    out = users_folder(tmp_path / "mine")
    exchange = ownership.exchange

    def write_first(a, b):
        assert inodes(Path(a)) == inodes(out)  # the new copy: links of the same files, none copied
        (out / "late.txt").write_text("written meanwhile")
        (out / ".notes.new").write_text("edited meanwhile")
        os.replace(out / ".notes.new", out / "notes.txt")  # as an editor saves
        (out / "sub" / "new").mkdir()
        return exchange(a, b)

    monkeypatch.setattr(ownership, "exchange", write_first)
    assert main(["export", str(run), str(out), "--force"]) == 0
    assert (out / "late.txt").read_text() == "written meanwhile" and (
        out / "notes.txt"
    ).read_text() == "edited meanwhile"
    assert (out / "sub" / "new").is_dir() and load_draft(out)[1] is not None
    assert sorted(os.listdir(tmp_path)) == ["mine", "run"]


def test_where_folders_cannot_be_swapped_a_folder_that_keeps_files_is_refused(run, tmp_path, monkeypatch, capsys):
    """Renaming the old folder aside, then the new one in, is two renames: a kill between them would leave the
    user's files in temporaries. A folder holding only an earlier export is still replaced so."""
    monkeypatch.setattr(ownership, "exchange", lambda a, b: False)
    out = users_folder(tmp_path / "mine")
    before = tree(out, but=())
    assert main(["export", str(run), str(out), "--force"]) == 2
    assert "cannot swap two folders in one rename" in capsys.readouterr().err and tree(out, but=()) == before
    draft = export_checkpoint(run, tmp_path / "draft")
    assert export_checkpoint(run, draft, dtype="float32") == draft
    assert json.loads((draft / "config.json").read_text())["torch_dtype"] == "float32"
    assert sorted(os.listdir(tmp_path)) == ["draft", "mine", "run"]


def test_a_mount_point_is_refused(run, tmp_path, monkeypatch):
    from sglang_lilicorr.train.export import check_destination

    (tmp_path / "disk").mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == tmp_path / "disk")
    with pytest.raises(UsageError) as e:
        check_destination(tmp_path / "disk", run)
    assert (e.value.what, e.value.fix) == (
        f"{tmp_path / 'disk'} is a mount point, which an export cannot replace with a new folder",
        "write the draft to a folder inside it",
    )


def test_force_never_replaces_a_folder_named_as_the_weights(run, tmp_path):
    out = export_checkpoint(run, tmp_path / "mine")
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").mkdir()
    (out / "model.safetensors" / "shard-1").write_bytes(b"weights")
    before = tree(out, but=())
    with pytest.raises(UsageError, match="holds a config.json and model.safetensors that is not a draft's"):
        export_checkpoint(run, out, force=True)
    assert tree(out, but=()) == before


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
    out = {
        "run": run,
        "checkpoints": run / "checkpoints",
        "step": run / "checkpoints" / "step-00000002",
        "inside": run / "draft",
        "parent": tmp_path,
        "other-run": other,
    }[where]
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
    assert check_destination(notes, run, force=True) == "keep"
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
    assert e.value.what == (
        f"{out} is inside a training run or checkpoint, {other}"
        if where == "inside"
        else f"{out} is a training run or checkpoint"
    )


@pytest.mark.parametrize(
    "kind, found",
    [
        ("missing", "not an existing folder"),
        ("plain", "not a training run or checkpoint"),
        ("draft", "a draft, not a training run"),
    ],
)
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


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("lilicorr.in_head.weight"), "missing tensor 'in_head.weight'"),
        (lambda t: t.__setitem__("lilicorr.extra", torch.zeros(2)), "unexpected tensor 'extra'"),
        (
            lambda t: t.__setitem__("lilicorr.same_slot_bias", torch.zeros(3)),
            r"'same_slot_bias' has shape \(3,\), expected \(4,\)",
        ),
    ],
)
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
    with pytest.raises(CheckpointError, match="holds head tensors but its train_state.json records no head"):
        export_checkpoint(run, tmp_path / "out")
    rewrite_tensors(run, lambda t: [t.pop(k) for k in [k for k in t if k.startswith("lilicorr.")]])
    draft = export_checkpoint(run, tmp_path / "out")  # a drafter alone: a vanilla DFlash draft
    assert load_draft(draft)[1] is None
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


# --- what mutation testing found untested: each sign of a run, each refusal in full, the other heads' configs --------


@pytest.mark.parametrize("sign", ["marker", "latest", "metrics", "state", "step"])
def test_each_sign_of_a_training_run_alone_is_refused(run, tmp_path, sign):
    from sglang_lilicorr.ownership import MARKER
    from sglang_lilicorr.train.export import check_destination

    out = tmp_path / "out"
    out.mkdir()
    path = {
        "marker": MARKER,
        "latest": "latest",
        "metrics": "metrics.jsonl",
        "state": "train_state.json",
        "step": "checkpoints/step-00000001",
    }[sign]
    (out / path).parent.mkdir(parents=True, exist_ok=True)
    (out / path).write_text('{"kind": "run"}' if sign == "marker" else "x")
    with pytest.raises(UsageError) as e:
        check_destination(out, run, force=True)
    assert (e.value.what, e.value.where, e.value.fix) == (
        f"{out} is a training run or checkpoint",
        "OUT_DIR",
        "write the draft to a folder outside any training run (--force does not change this)",
    )
    (out / path).unlink()
    (out / "checkpoints" / "other").mkdir(parents=True, exist_ok=True)  # a folder of that name alone is no sign
    assert check_destination(out, run, force=True) == "keep"


def test_each_destination_refusal_in_full(run, tmp_path):
    from sglang_lilicorr.ownership import MARKER
    from sglang_lilicorr.train.export import check_destination

    def refused(out, force=False):
        with pytest.raises(UsageError) as e:
            check_destination(out, run, force)
        assert e.value.where == "OUT_DIR"
        return e.value.what, e.value.fix

    assert refused(run / "checkpoints" / "step-00000002" / "x") == (
        f"{run / 'checkpoints' / 'step-00000002' / 'x'} is inside a training run or checkpoint, "
        f"{run / 'checkpoints' / 'step-00000002'}",
        "write the draft to a folder outside any training run (--force does not change this)",
    )
    step = run / "checkpoints" / "step-00000002"
    with pytest.raises(UsageError) as e:
        check_destination(step.parent, step)
    assert (e.value.what, e.value.where, e.value.fix) == (
        f"{step.parent} is or contains the checkpoint being exported ({step})",
        "OUT_DIR",
        "write the draft to a folder outside the training run",
    )
    (tmp_path / "file").write_text("x")
    assert refused(tmp_path / "file") == (f"{tmp_path / 'file'} is a file", "pass a folder path for the draft")
    data = tmp_path / "data"
    data.mkdir()
    (data / MARKER).write_text('{"kind": "dataset"}')  # a folder of ours, empty but for its marker
    assert refused(data, force=True) == (
        f"{data} is a dataset folder written by lilicorr, not a draft",
        "pick a new or empty folder (--force does not change this)",
    )
    many = tmp_path / "many"
    many.mkdir()
    for i in range(7):
        (many / f"f{i}").write_text("x")
    assert refused(many) == (
        f"{many} is not empty and is not an earlier export, it holds ['f0', 'f1', 'f2', 'f3', 'f4']",
        "pick a new or empty folder, or pass --force to write the draft's config.json and model.safetensors beside "
        "those files (--force keeps them as they are)",
    )
    (many / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (many / "model.safetensors").write_bytes(b"weights")
    assert refused(many, force=True) == (
        f"{many} holds a config.json and model.safetensors that is not a draft's (a model folder?)",
        "pick a new or empty folder; --force never replaces files that are not a draft's",
    )
    (tmp_path / "empty").mkdir()
    assert check_destination(tmp_path / "empty", run) == "replace"


def test_force_writes_over_a_drafts_files_beside_others(run, tmp_path):
    out = export_checkpoint(run, tmp_path / "draft")
    (out / "notes.txt").write_text("mine")
    assert export_checkpoint(run, out, dtype="float32", force=True) == out
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    assert (out / "notes.txt").read_text() == "mine"


def test_the_dtype_reaches_the_config_and_the_tensors(run, tmp_path):
    from safetensors.torch import load_file

    out = export_checkpoint(run, tmp_path / "draft", dtype="float16")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {torch.float16}
    with pytest.raises(UsageError) as e:
        export_checkpoint(run, tmp_path / "other", dtype="float64")
    assert str(e.value) == "--dtype 'float64' is not a draft dtype: choose one of ['bfloat16', 'float16', 'float32']"


def test_a_new_folder_clears_only_its_own_leftovers(run, tmp_path):
    """A killed export of tmp/draft leaves .draft.lilicorr-tmp-*; the next export of tmp/draft removes it, and not
    the leftovers of another folder's write."""
    mine, other = tmp_path / ".draft.lilicorr-tmp-1-aaaa", tmp_path / ".other.lilicorr-tmp-1-bbbb"
    mine.mkdir()
    other.mkdir()
    export_checkpoint(run, tmp_path / "draft")
    assert not mine.exists() and other.exists()


def test_the_source_refusals_say_what_to_pass(tmp_path):
    with pytest.raises(UsageError) as e:
        export_checkpoint(tmp_path / "nowhere", tmp_path / "out")
    assert e.value.fix == "pass a `lilicorr train` --output-dir (its latest checkpoint) or OUTPUT/checkpoints/step-N"


def test_a_bad_tensor_is_named_with_its_part(tmp_path):
    from sglang_lilicorr.checkpoint import CheckpointError

    for part, name in (("drafter", "fc.weight"), ("head", "lilicorr.in_head.weight")):
        run = write_run(tmp_path / part)
        rewrite_tensors(run, lambda t: t.pop(name))
        with pytest.raises(CheckpointError) as e:
            export_checkpoint(run, tmp_path / "out")
        assert e.value.where == f"{run} ({part})"


@pytest.mark.parametrize("head", ["domino", "dspark"])
def test_a_corrector_head_gets_its_serving_config(head):
    from sglang_lilicorr.baselines import DominoConfig, DSparkConfig
    from sglang_lilicorr.train.export import draft_config

    config = DominoConfig(gru_hidden_dim=24, emb_dim=40) if head == "domino" else DSparkConfig(markov_rank=12)
    out = draft_config(DRAFTER, config, "float32")
    assert out == config.serving_config({**DRAFTER.to_hf_config(), "torch_dtype": "float32"})
    assert type(config).of_serving_config(out) == config
