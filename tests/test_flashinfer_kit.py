"""The slim flashinfer of tools/device/flashinfer_kit.sh (issue 44): generated on the CPU from the archive itself,
every JIT module SGLang's flashinfer attention backend and sampling use finds its sources, the files its generator
opens and every #include that resolved in the full wheel. Skipped without .dev/flashinfer (CI has no .dev)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".dev" / "flashinfer"
TAR = KIT / "flashinfer_slim.tar.xz"

pytestmark = [
    pytest.mark.skipif(not TAR.is_file(), reason="no .dev/flashinfer (bash tools/device/flashinfer_kit.sh)"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="generating the JIT sources needs torch"),
]


def test_slim_archive_has_every_jit_module_file(tmp_path):
    deps = tmp_path / "deps"  # pynvml & co. from the kit's wheels, as the device installs them
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(deps),
            *map(str, sorted((KIT / "whl").glob("*.whl"))),
        ],
        check=True,
    )
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools/device/flashinfer_slim.py"), "check", str(TAR)],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "FI_SLIM_DEPS": str(deps)},
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "8 modules, 0 problems" in r.stdout
