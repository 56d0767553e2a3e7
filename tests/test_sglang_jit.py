"""benchmarks/device/sglang_jit.sh on the CPU: SGLang's JIT builds carried from one GPU machine to the next, unpacked by
the first call that carries them (also after calls that did not), returned only where a call's servers built more."""

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def jit(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "benchmarks" / "device" / "sglang_jit.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def build(cache: Path, name: str) -> None:
    """What a server's first run of a JIT kernel leaves: the module, and a build in progress beside it."""
    (cache / "sm90a" / name / "build-1").mkdir(parents=True)
    (cache / "sm90a" / name / "build-1" / f"{name}.so").write_text(name)
    (cache / ".staging-1").mkdir(exist_ok=True)
    (cache / ".staging-1" / "half.so").write_text("half")


def test_a_machine_unpacks_the_carried_cache_once_and_returns_only_new_builds(tmp_path):
    root, ret, cache = tmp_path / "root", tmp_path / "ret", tmp_path / "machine" / "jit"
    (root / "benchmarks" / "device").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "device" / "sglang_jit.sh", root / "benchmarks" / "device")
    env = dict(os.environ, SGLANG_JIT_CACHE_DIR=str(cache), SGLANG_JIT_STATE=str(tmp_path / "machine" / "jit.sum"))

    # a fresh machine's first call, nothing carried (no room in it): its server builds a module, which comes back
    assert jit(root, env, "unpack").returncode == 0
    build(cache, "rmsnorm")
    done = jit(root, env, "pack", str(ret))
    assert done.returncode == 0 and "SGLang JIT module sm90a/rmsnorm/build-1/rmsnorm.so (" in done.stdout
    with tarfile.open(ret / "sglang_jit.tar.gz") as t:
        names = {n.removeprefix("./") for n in t.getnames()}
    assert "sm90a/rmsnorm/build-1/rmsnorm.so" in names and not any(".staging-" in n for n in names)
    (ret / "sglang_jit.tar.gz").unlink()
    assert jit(root, env, "pack", str(ret)).stdout == "" and not ret.joinpath("sglang_jit.tar.gz").exists()

    # a later call on the same machine carries an earlier session's cache: unpacked now, although the machine has state
    carried = tmp_path / "other"
    build(carried, "speculative_sampling")
    (root / ".dev" / "sglang_jit").mkdir(parents=True)
    with tarfile.open(root / ".dev" / "sglang_jit" / "sglang_jit.tar.gz", "w:gz") as t:
        t.add(carried / "sm90a", arcname="sm90a")
    done = jit(root, env, "unpack")
    assert "2 module build(s) unpacked into" in done.stdout
    assert (cache / "sm90a" / "speculative_sampling" / "build-1" / "speculative_sampling.so").is_file()
    assert jit(root, env, "pack", str(ret)).stdout == ""  # what was carried does not come back
    assert jit(root, env, "unpack").stdout == ""  # once per machine
    build(cache, "fused_rope")
    assert "3 module build(s)" in jit(root, env, "pack", str(ret)).stdout

    # a carried cache that cannot be read costs the builds, not the call
    (root / ".dev" / "sglang_jit" / "sglang_jit.tar.gz").write_text("not a tar")
    env["SGLANG_JIT_STATE"] = str(tmp_path / "fresh" / "jit.sum")
    done = jit(root, env, "unpack")
    assert done.returncode == 0 and "unpacking" in done.stdout and "failed; its kernels build again" in done.stdout
    done = jit(root, env, "repack")
    assert done.returncode == 2 and "usage: bash benchmarks/device/sglang_jit.sh unpack | pack DIR" in done.stderr


def test_testbed_calls_unpack_before_their_servers_and_return_what_they_built(tmp_path):
    """benchmarks/device/testbed_calls.sh model, its step a stand-in that builds a JIT module as a server would: the
    carried cache is in place before the step runs, and the call returns the grown cache beside results.tar.gz."""
    root, cache, ret = tmp_path / "root", tmp_path / "jit", tmp_path / "ret"
    (root / "benchmarks" / "device").mkdir(parents=True)
    for name in ("testbed_calls.sh", "sglang_jit.sh"):
        shutil.copy(ROOT / "benchmarks" / "device" / name, root / "benchmarks" / "device")
    (root / ".dev" / "bin").mkdir(parents=True)
    (root / ".dev" / "bin" / "smol.sh").write_text(
        f'ls "{cache}/sm90a" > "{tmp_path}/seen.txt"; '
        f'mkdir -p "{cache}/sm90a/rope" && echo so > "{cache}/sm90a/rope/rope.so"\n'
    )
    carried = tmp_path / "carried"
    build(carried, "rmsnorm")
    (root / ".dev" / "sglang_jit").mkdir(parents=True)
    with tarfile.open(root / ".dev" / "sglang_jit" / "sglang_jit.tar.gz", "w:gz") as t:
        t.add(carried / "sm90a", arcname="sm90a")
    env = dict(
        os.environ,
        OUT=str(ret),
        CALLS_WORK=str(tmp_path / "calls"),
        SGLANG_JIT_CACHE_DIR=str(cache),
        SGLANG_JIT_STATE=str(tmp_path / "jit.sum"),
    )
    done = subprocess.run(
        ["bash", str(root / "benchmarks" / "device" / "testbed_calls.sh"), "model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "seen.txt").read_text().split() == ["rmsnorm"]  # unpacked before the step's servers
    assert "SGLang JIT module sm90a/rope/rope.so (" in done.stdout
    with tarfile.open(ret / "sglang_jit.tar.gz") as t:
        assert {"sm90a/rmsnorm/build-1/rmsnorm.so", "sm90a/rope/rope.so"} <= {
            n.removeprefix("./") for n in t.getnames()
        }
    assert (ret / "results.tar.gz").is_file()
