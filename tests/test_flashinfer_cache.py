"""benchmarks/device/flashinfer_cache.sh on the CPU: a flashinfer JIT cache built on one GPU machine and
carried to the next is up to date there for ninja (which decides whether flashinfer builds or loads a module), although
the next machine's kit installs tvm_ffi's headers, which every module includes, later than the cache's objects; a cache
built with other versions is left out with a line that says so; bad calls get one clear line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device" / "flashinfer_cache.sh"
NINJA = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")

# a stand-in for nvcc: writes the object and a gcc-style depfile naming the source and tvm_ffi's header
COMPILE = (
    "import sys; src, hdr, out = sys.argv[1:]; open(out, 'w').write('obj'); "
    "open(out + '.d', 'w').write(f'{out}: {src} {hdr}\\n')"
)


def install_kit(site: Path, tvm_version: str = "0.1.11") -> None:
    """The device kit's install on a fresh machine: tvm_ffi (its files dated now) and the flashinfer package."""
    shutil.rmtree(site, ignore_errors=True)
    (site / "tvm_ffi" / "include").mkdir(parents=True)
    (site / "tvm_ffi" / "__init__.py").write_text("")
    (site / "tvm_ffi" / "include" / "ffi.h").write_text("// tvm_ffi\n")
    for name, version in (("apache_tvm_ffi", tvm_version), ("flashinfer_python", "0.7.2")):
        meta = site / f"{name}-{version}.dist-info"
        meta.mkdir()
        meta.joinpath("METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        )


def write_module(cache: Path, site: Path) -> Path:
    """One JIT module's build folder as flashinfer writes it: build.ninja and its generated source."""
    mod = cache / "0.7.2" / "90a" / "cached_ops" / "sampling"
    mod.mkdir(parents=True)
    (mod / "sampling.cu").write_text("// source\n")
    (mod / "build.ninja").write_text(
        f'rule nvcc\n  command = {sys.executable} -c "{COMPILE}" $in {site}/tvm_ffi/include/ffi.h $out\n'
        "  depfile = $out.d\n  deps = gcc\n"
        f"build {mod}/sampling.cuda.o: nvcc {mod}/sampling.cu\n"
    )
    return mod


def dry_run(mod: Path) -> str:
    return subprocess.run([NINJA, "-C", str(mod), "-n"], capture_output=True, text=True).stdout


def cache_sh(mode: str, tarball: Path, site: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SITE=str(site), CACHE=str(cache), PATH=f"{Path(NINJA).parent}:{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", str(SCRIPT), mode, str(tarball)], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def carried(tmp_path):
    """A cache built on machine A and packed; machine B: the same paths, a fresh kit, no cache yet."""
    if not Path(NINJA).exists():
        pytest.skip("no ninja (requirements.txt installs it)")
    site, cache, tarball = tmp_path / "site", tmp_path / "cache", tmp_path / "jit_cache.tar.gz"
    install_kit(site)
    mod = write_module(cache, site)
    subprocess.run([NINJA, "-C", str(mod)], check=True, capture_output=True)
    assert "no work to do" in dry_run(mod)
    packed = cache_sh("pack", tarball, site, cache)
    assert packed.returncode == 0, packed.stderr
    assert "flashinfer 0.7.2, apache-tvm-ffi 0.1.11" in packed.stdout
    later = mod.joinpath("sampling.cuda.o").stat().st_mtime + 3600  # B's install: after A's build
    shutil.rmtree(cache)
    install_kit(site)
    os.utime(site / "tvm_ffi" / "include" / "ffi.h", (later, later))
    return site, cache, tarball, mod


def test_a_carried_cache_is_up_to_date_on_the_next_machine(carried):
    site, cache, tarball, mod = carried
    done = cache_sh("unpack", tarball, site, cache)
    assert done.returncode == 0, done.stderr
    assert "1 module(s) up to date, 0 to build or finish (none)" in done.stdout
    assert "no work to do" in dry_run(mod)
    assert (site / "tvm_ffi" / "include" / "ffi.h").stat().st_mtime == 0


def test_without_dating_tvm_ffi_back_ninja_would_rebuild(carried):
    """The failure the script exists for (every module rebuilt on an H200 at e056a07): the same cache unpacked as is."""
    site, cache, tarball, mod = carried
    cache.mkdir()
    subprocess.run(["tar", "-C", str(cache), "-xzf", str(tarball)], check=True)
    assert "no work to do" not in dry_run(mod) and "sampling.cuda.o" in dry_run(mod)


def test_a_cache_of_other_versions_is_left_out(carried):
    site, cache, tarball, mod = carried
    install_kit(site, tvm_version="0.1.12")
    done = cache_sh("unpack", tarball, site, cache)
    assert done.returncode == 0, done.stderr
    assert "left out: built with 'flashinfer 0.7.2, apache-tvm-ffi 0.1.11'" in done.stdout
    assert "'flashinfer 0.7.2, apache-tvm-ffi 0.1.12'; every module builds" in done.stdout
    assert not cache.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "usage: bash benchmarks/device/flashinfer_cache.sh unpack|pack TARBALL"),
        (["unpack", "/nonexistent/jit_cache.tar.gz"], "no carried JIT cache at /nonexistent/jit_cache.tar.gz"),
        (["pack", "/tmp/x.tar.gz"], "no flashinfer-python or apache-tvm-ffi installed in"),
    ],
)
def test_bad_calls_say_what_is_wrong(tmp_path, args, message):
    site = tmp_path / "empty_site"
    site.mkdir()
    if args and args[0] == "unpack":
        install_kit(site)
    env = dict(os.environ, SITE=str(site), CACHE=str(tmp_path / "cache"), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and message in done.stderr
