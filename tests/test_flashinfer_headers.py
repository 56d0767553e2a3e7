"""benchmarks/device/flashinfer_headers.py: the include closure of sampling.cuh from a flashinfer-python wheel as a
headers-only package SGLang's JIT finds (and nothing else of flashinfer), its clear errors, and
benchmarks/device/check_lib.sh installing it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.device import flashinfer_headers  # noqa: E402

INCLUDE = flashinfer_headers.INCLUDE
HEADERS = {
    "flashinfer/sampling.cuh": '#include <cub/cub.cuh>\n#include "math.cuh"\n#include <flashinfer/vec_dtypes.cuh>\n',
    "flashinfer/math.cuh": '#include <cuda_fp16.h>\n#include "detail/fast.cuh"\n',
    "flashinfer/detail/fast.cuh": "#pragma once\n",
    "flashinfer/vec_dtypes.cuh": '  #  include "math.cuh"\n',
    "flashinfer/attention/decode.cuh": "// not included by sampling.cuh\n",
}


def fake_wheel(path: Path, version: str = flashinfer_headers.VERSION, headers: dict = HEADERS) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            f"flashinfer_python-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n",
        )
        z.writestr("flashinfer/__init__.py", "import flashinfer.jit  # the real package imports much more\n")
        for name, text in headers.items():
            z.writestr(INCLUDE + name, text)
    return path


def test_the_closure_of_sampling_cuh_and_nothing_else(tmp_path):
    out = tmp_path / "dev"
    assert flashinfer_headers.main([str(fake_wheel(tmp_path / "w.whl")), "--out", str(out)]) == 0
    package = out / "flashinfer"
    written = sorted(
        str(p.relative_to(package / "data" / "include")) for p in (package / "data" / "include").rglob("*.cuh")
    )
    assert written == [
        "flashinfer/detail/fast.cuh",
        "flashinfer/math.cuh",
        "flashinfer/sampling.cuh",
        "flashinfer/vec_dtypes.cuh",
    ]
    assert "jit" not in (package / "__init__.py").read_text()  # no Python API
    assert (
        flashinfer_headers.main([str(fake_wheel(tmp_path / "w.whl")), "--out", str(out)]) == 0
    )  # its own output is replaced


def test_sglang_finds_the_headers_and_not_a_flashinfer_api(tmp_path):
    out = tmp_path / "dev"
    flashinfer_headers.main([str(fake_wheel(tmp_path / "w.whl")), "--out", str(out)])
    code = (
        "from sglang.kernels.jit.utils.deps import get_flashinfer_include_paths as g; print(g()[0]);"
        "from sglang.srt.utils.common import is_flashinfer_available as a; print(a());"
        "import importlib.util as u; print(u.find_spec('flashinfer.sampling'))"
    )
    env = dict(os.environ, PYTHONPATH=str(out), SGLANG_IS_FLASHINFER_AVAILABLE="false")
    lines = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert lines == [str(out / "flashinfer" / "data" / "include"), "False", "None"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("version", "flashinfer-python 0.6.0, but SGLang 0.5.23 compiles against 0.7.2"),
        ("missing", "flashinfer/data/include/flashinfer/math.cuh is included but not in the wheel"),
        ("corrupt", "not a readable wheel"),
        ("foreign", "exists and was not written by this tool"),
    ],
)
def test_bad_inputs_are_named_and_nothing_is_overwritten(tmp_path, capsys, case, message):
    wheel = tmp_path / "w.whl"
    out = tmp_path / "dev"
    if case == "version":
        fake_wheel(wheel, version="0.6.0")
    elif case == "missing":
        fake_wheel(wheel, headers={k: v for k, v in HEADERS.items() if k != "flashinfer/math.cuh"})
    elif case == "corrupt":
        wheel.write_bytes(b"not a zip")
    else:
        fake_wheel(wheel)
        (out / "flashinfer").mkdir(parents=True)
        (out / "flashinfer" / "mine.txt").write_text("keep")
    assert flashinfer_headers.main([str(wheel), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    if case == "foreign":
        assert (out / "flashinfer" / "mine.txt").read_text() == "keep"


def test_check_lib_installs_carried_headers(tmp_path):
    dev = tmp_path / "dev"
    flashinfer_headers.main([str(fake_wheel(tmp_path / "w.whl")), "--out", str(dev / "flashinfer_headers")])
    site = tmp_path / "site"
    site.mkdir()
    script = (
        f"S={tmp_path / 'summary.txt'}; SITE={site}; source {ROOT / 'benchmarks' / 'device' / 'check_lib.sh'}; "
        f"install_flashinfer_headers {dev}; "
        "echo flag=$SGLANG_IS_FLASHINFER_AVAILABLE"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60).stdout
    assert "flashinfer headers installed (4 files)" in out and "flag=false" in out
    assert (site / "flashinfer" / "data" / "include" / "flashinfer" / "sampling.cuh").is_file()
