"""What a command may write: a new folder, an empty one, or one of its own kind; and writes that are whole or absent.

Kinds `run`, `dataset` and `report` carry a marker, `.lilicorr.json`; an `export` is recognised by its content
(config.json + model.safetensors). Temporaries are `.<name>.lilicorr-tmp-<random>` beside what they become, removed by
the next writer of the place. One writer at a time (`sole_writer`): an flock on `.<name>.lilicorr-lock` beside the
target, released by the kernel however the process ends; a second writer is refused (exit 2), naming the holder."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
from pathlib import Path
from typing import Callable, Collection, Iterator

from .errors import LiLiCorrError, UsageError
from .jsonl import loads

MARKER = ".lilicorr.json"
TMP_TAG = ".lilicorr-tmp-"
LOCK_TAG = ".lilicorr-lock"
KINDS = {
    "run": "a training run",
    "dataset": "a data set made by `lilicorr regenerate --recipe`",
    "report": "a report folder written by lilicorr",
    "export": "a draft written by `lilicorr export`",
}


class NotOursError(UsageError):
    """A command was pointed at a folder or file it did not write and must not change (exit 2)."""


class HeldError(UsageError):
    """Another process is writing the same run, draft or results file (exit 2)."""


class DiskFullError(LiLiCorrError):
    """A write found no space left on its device (exit 1); what was there before is whole."""


# --- temporaries and atomic writes -------------------------------------------------------------------


def temporary_name(final: str | os.PathLike) -> Path:
    """A fresh hidden name beside `final` that `remove_temporaries` recognises."""
    final = Path(os.path.abspath(final))
    return final.parent / f".{final.name}{TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and TMP_TAG in path.name


def remove_temporaries(folder: str | os.PathLike, of: str | None = None) -> list[Path]:
    """Remove what an interrupted write left in `folder` (with `of`, that name's temporaries) -> what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    prefix = None if of is None else f".{of}{TMP_TAG}"
    found = [p for p in folder.iterdir() if is_temporary(p) and (prefix is None or p.name.startswith(prefix))]
    for p in found:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    return found


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path that replaces `path` (fsynced) when the block completes, removed when it fails."""
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK)  # as a plainly written file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_UMASK = os.umask(0o022)  # read once, at import (setting it and back later would race with other threads), ...
os.umask(_UMASK)  # ... and put back


def sha256_of(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """`data` written to `path` whole or not at all."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike, keep_all_but: Collection[str] | None = None) -> Iterator[Path]:
    """An empty temporary directory beside `target` that takes its place when the block completes (swapped in one
    rename, else renamed aside) and is removed when it fails. With `keep_all_but` (the names the block writes) it starts
    as `target`'s twin (`link_tree`), the old one going by `put_back`; no exchange: UsageError."""
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(target)
    tmp.mkdir()
    try:
        keeps = keep_all_but is not None and target.is_dir() and link_tree(target, tmp, skip=keep_all_but)
        yield tmp
        if not target.exists():
            os.replace(tmp, target)
            return
        if keep_all_but is not None:
            shutil.copystat(target, tmp)
            os.utime(tmp)  # its mode and attributes, the time of this write
        if not exchange(tmp, target):
            if keeps:
                raise UsageError(
                    f"the file system of {target} cannot swap two folders in one rename, which replacing part of a "
                    "folder while keeping the rest needs",
                    where=str(target),
                    fix="write into a new or empty folder, or move the other files out of this one",
                )
            _rename_aside(tmp, target)
        # tmp now holds the old folder
        shutil.rmtree(tmp) if keep_all_but is None else put_back(tmp, target, drop=keep_all_but)
    except BaseException:  # an error or an interrupt: what is not the target's is removed, whichever it holds
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def link_tree(source: Path, twin: Path, skip: Collection[str] = ()) -> int:
    """Fill `twin` (new, empty, on `source`'s file system) with hard links of all `source` holds but `skip` (and its
    temporaries), folders made alike -> entries. Nothing is copied: what cannot be linked raises NotOursError."""
    if not os.access(source, os.R_OK | os.W_OK | os.X_OK):
        raise _cannot_keep(source, "a folder this user may not write")
    try:
        want, have = os.stat(source), os.stat(twin)
        if (want.st_uid, want.st_gid) != (have.st_uid, have.st_gid):
            os.chown(twin, want.st_uid, want.st_gid)
        device = want.st_dev
        with os.scandir(source) as listing:
            entries = [e for e in listing if e.is_dir(follow_symlinks=False) or not _named(e.name, skip)]
    except OSError as e:
        raise _cannot_keep(source, e.strerror or str(e)) from e
    for entry in entries:
        path, there = Path(entry.path), twin / entry.name
        try:
            if not entry.is_dir(follow_symlinks=False):
                os.link(path, there, follow_symlinks=False)
                continue
            if entry.stat(follow_symlinks=False).st_dev != device:
                raise _cannot_keep(path, "another file system is mounted there")
            there.mkdir()
            link_tree(path, there)
            shutil.copystat(path, there, follow_symlinks=False)
        except OSError as e:
            raise _cannot_keep(path, e.strerror or str(e)) from e
    return len(entries)


def _named(name: str, names: Collection[str]) -> bool:
    """`name` is one of `names` or a temporary of one (what a killed writer of it left)."""
    return name in names or any(name.startswith(f".{n}{TMP_TAG}") for n in names)


def _cannot_keep(path: Path, why: str) -> NotOursError:
    return NotOursError(
        f"{why}: it cannot be kept as it is in a new copy of its folder",
        where=str(path),
        fix="move it out of the folder (or make it writable), or write into a new or empty folder: a folder's other "
        "files are kept as hard links in its new copy, never copied",
    )


def put_back(old: Path, new: Path, drop: Collection[str] = ()) -> None:
    """Remove `old`, replaced by `new` (`link_tree`): what was written into it meanwhile moves into `new`."""
    with os.scandir(old) as listing:
        entries = list(listing)
    for entry in entries:
        path, there = Path(entry.path), new / entry.name
        folder = entry.is_dir(follow_symlinks=False)
        if not folder and (_named(entry.name, drop) or _same_file(entry.stat(follow_symlinks=False), there)):
            os.unlink(path)
        elif folder and there.is_dir() and not there.is_symlink():
            put_back(path, there)
        else:
            os.replace(path, there)
    os.rmdir(old)


def _rename_aside(new: Path, target: Path) -> None:
    """`new` takes `target`'s place, `target` `new`'s name (two renames); an interrupt between puts `target` back."""
    old = temporary_name(target)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    os.replace(old, new)


_LIBC = ctypes.CDLL(None, use_errno=True)
_RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` atomically (renameat2 RENAME_EXCHANGE) -> False where that cannot be done."""
    call = getattr(_LIBC, "renameat2", None)
    if call is None:
        return False
    at_cwd = -100  # AT_FDCWD
    if call(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


# --- one writer at a time -----------------------------------------------------------------------------


def lock_path(target: str | os.PathLike) -> Path:
    """The lock file of `target`: `.<name>.lilicorr-lock` beside it."""
    target = Path(os.path.abspath(target))
    return target.parent / f".{target.name}{LOCK_TAG}"


def is_lock(path: Path) -> bool:
    """A lock file of `sole_writer` (never what a folder holds)."""
    return path.name.startswith(".") and path.name.endswith(LOCK_TAG)


@contextlib.contextmanager
def sole_writer(target: str | os.PathLike, option: str, what: str) -> Iterator[None]:
    """The block runs as the only writer of `target` (`what`: "run", "draft", "results file"); else HeldError (exit 2)
    naming the holder. A killed holder's lock file stays, unheld, and the next writer takes it."""
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise HeldError(
                f"{target} is being written by {holder}",
                where=option,
                fix=f"a {what} has one writer at a time: wait until that command ends, or stop it",
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(os.fstat(fd), path, follow=True):
            break
        os.close(fd)  # the holder released it and removed the file as we opened it: take the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _same_file(here: os.stat_result, path: Path, follow: bool = False) -> bool:
    """`here` is the file at `path` (with `follow`, the file a symlink there names)."""
    try:
        there = os.stat(path, follow_symlinks=follow)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


# --- a full disk ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def space_for(path: str | os.PathLike, need: int, option: str) -> Iterator[None]:
    """Writes under `path` that find the device full end as one DiskFullError: `no space left on DEVICE (PATH):
    free N MB or choose another OPTION`, N what `need` bytes lack of the space free now."""
    try:
        yield
    except Exception as e:
        full = (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)
        if not full or isinstance(e, DiskFullError):  # (safetensors reports a full device only in its text)
            raise
        where = Path(os.path.abspath(path))
        folder = next((p for p in (where, *where.parents) if p.is_dir()), Path("/"))
        short = max(1, -(-(need - shutil.disk_usage(folder).free) // 1_000_000))
        raise DiskFullError(
            f"no space left on {device_of(folder)}", where=str(path), fix=f"free {short} MB or choose another {option}"
        ) from e


def device_of(folder: Path) -> str:
    """The device (or file system) a folder lives on, as /proc/mounts names it; the folder itself elsewhere."""
    try:
        mounts = [line.split()[:2] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return str(folder)
    real = os.path.realpath(folder)
    inside = [(point, source) for source, point in mounts if real == point or real.startswith(point.rstrip("/") + "/")]
    return max(inside, key=lambda m: len(m[0]))[1] if inside else str(folder)


# --- folders: new, empty, or ours ----------------------------------------------------------------------


def marked_kind(folder: str | os.PathLike) -> str | None:
    """The kind a folder's marker declares, or None."""
    try:
        value = loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value.get("kind") if isinstance(value, dict) and value.get("kind") in KINDS else None


def mark(folder: str | os.PathLike, kind: str) -> None:
    if marked_kind(folder) != kind:
        write_atomic(Path(folder) / MARKER, json.dumps({"kind": kind, "written_by": "lilicorr"}) + "\n")


def held(folder: Path) -> list[str]:
    """What a folder holds, but for its marker (when it is one of ours), temporaries and lock files."""
    ours = marked_kind(folder) is not None
    return sorted(
        p.name for p in folder.iterdir() if not (p.name == MARKER and ours) and not is_temporary(p) and not is_lock(p)
    )


def claim_folder(
    folder: str | os.PathLike,
    kind: str,
    option: str,
    recognise: Callable[[Path], bool] | None = None,
    create: bool = True,
    fix: str | None = None,
) -> str:
    """Make sure `folder` may be written by a command of `kind` -> "new", "empty" or "ours"; with `create`, creates
    it, removes the temporaries a killed writer left in it and leaves the marker. Else NotOursError, nothing touched."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise NotOursError(f"{folder} is a file, not a folder", where=option, fix="pass a new or empty folder")
    state = "new" if not path.exists() else "empty" if not held(path) else None
    if state is None:
        found = marked_kind(path)
        if found == kind or (found is None and recognise is not None and recognise(path)):
            state = "ours"
        else:
            what = f"it is {KINDS[found]}" if found else f"it holds {held(path)[:5]}"
            raise NotOursError(
                f"{folder} is not empty and is not {KINDS[kind]}, {what}",
                where=option,
                fix=fix
                or f"pick a new or empty folder; {KINDS[kind]} is written only there or over one of its own kind",
            )
    if create:
        path.mkdir(parents=True, exist_ok=True)
        remove_temporaries(path)  # what a killed writer of this folder left (only names of temporary_name)
        mark(path, kind)
    return state


def claim_report_folder(folder: str | os.PathLike, create: bool = True) -> Path:
    """--out of a command that writes a report: new, empty, or an earlier report -> the folder."""
    fix = "pick a new or empty folder, or an earlier report's folder (reports are written nowhere else)"
    claim_folder(folder, "report", "--out", create=create, fix=fix)
    return Path(folder)


def claim_file(path: str | os.PathLike, recognise: Callable[[Path], bool], what: str, option: str) -> Path:
    """A file a command replaces whole: it must be missing, empty or `what` (`recognise`); else NotOursError."""
    path = Path(path)
    if path.is_dir() or (path.exists() and path.stat().st_size and not recognise(path)):
        raise NotOursError(
            f"{path} is not {what}", where=option, fix=f"pass a new file or {what}; this one is left as it is"
        )
    return path


# --- append-only JSON-lines files ---------------------------------------------------------------------


def jsonl_for_append(
    path: str | os.PathLike,
    is_record: Callable[[object], bool],
    what: str,
    option: str,
    error: type[LiLiCorrError] = LiLiCorrError,
) -> int | None:
    """Check, reading only, that `path` is missing, empty or a JSON-lines file of `what` records -> the offset of a torn
    last line to cut, else None. A bad first line: NotOursError (exit 2); a later bad line: `error` (exit 1)."""
    path = Path(path)
    if not path.exists():
        return None
    if not path.is_file():
        raise NotOursError(f"{path} is not a file", where=option, fix=f"pass {what} or a new file")
    data = path.read_bytes()
    lines = data.split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline
    torn = None
    if last.strip():
        if _record_or_none(last, is_record) is not None or not lines:
            lines.append(last)  # a whole last line without its newline (or the only line: must be a record)
        else:
            torn = len(data) - len(last)
    first = True
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if _record_or_none(line, is_record) is None:
            if first:
                raise _not_records(path, what, option, f"line {number}")
            raise error(
                f"line {number} is not {what}'s record",
                where=f"{path}:{number}",
                fix="fix or remove that line (the file was not changed)",
            )
        first = False
    if torn is not None and first:
        raise _not_records(path, what, option, "its only line")
    return torn


def _not_records(path: Path, what: str, option: str, line: str) -> NotOursError:
    fix = f"pass {what} or a new file; this file is left as it is"
    return NotOursError(f"{path} is not {what}: {line} is not one of its records", where=option, fix=fix)


def _record_or_none(line: bytes, is_record: Callable[[object], bool]):
    try:
        value = loads(line.decode("utf-8"))
    except ValueError:
        return None
    return value if is_record(value) else None


def open_for_append(path: str | os.PathLike, torn: int | None, what: str):
    """`path` opened to append: a torn last line cut (warned), a missing final newline added."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if torn is not None:
        print(
            f"warning: cutting the torn last line of {path} (an interrupted write of {what}); it is written again.",
            file=sys.stderr,
        )
        with path.open("r+b") as f:
            f.truncate(torn)
    needs_newline = path.exists() and path.stat().st_size > 0 and not _ends_with_newline(path)
    out = path.open("a", encoding="utf-8")
    if needs_newline:
        out.write("\n")
        out.flush()
    return out


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
