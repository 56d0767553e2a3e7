"""The slim flashinfer of benchmarks/device/flashinfer_kit.sh.

- The audit (no archive needed, fast): every flashinfer name that SGLang 0.5.23's flashinfer attention backend,
  sampler and DFlash path use maps to JIT modules (flashinfer_slim.FLASHINFER_API), each of them in MODULES, and every
  flashinfer header SGLang's own JIT kernels include is in HEADERS; a module dropped from MODULES fails it. Skipped
  without an importable sglang.
- The archive (skipped without .dev/flashinfer; CI has no .dev): it holds every module's package sources (quantization's
  too: the custom-mask verify packs its mask with segment_packbits) and the headers, read from its listing; and, from
  the archive itself, every JIT module's sources generate, the files its generator opens and every #include that
  resolved in the full wheel are there (`flashinfer_slim.py check`)."""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".dev" / "flashinfer"
TAR = KIT / "flashinfer_slim.tar.xz"
from benchmarks import lab_env  # noqa: E402
from benchmarks.device import flashinfer_slim  # noqa: E402

needs_tar = pytest.mark.skipif(
    not TAR.is_file(),
    reason="checks the slim flashinfer archive, not built here: `bash benchmarks/device/flashinfer_kit.sh`",
)
SGLANG = importlib.util.find_spec("sglang")
needs_sglang = pytest.mark.skipif(SGLANG is None, reason="no sglang to audit")


@needs_sglang
def test_every_flashinfer_call_of_sglangs_path_builds_only_modules_of_the_slim_archive():
    table, problems = flashinfer_slim.audit(Path(SGLANG.origin).parent)
    assert problems == []
    reached = {m for names in table.values() for mods in names.values() for m in mods}
    # decode, FA2 paged (+ its independent-stride twin), the custom mask's packbits, FA3 ragged, merge_state, sampling,
    # the DFlash selector's top-k; page (append_paged_kv_cache) is a spare SGLang does not call
    assert set(flashinfer_slim.MODULES) - reached == {"page"}
    assert (
        "quantization"
        in table["srt/layers/attention/flashinfer_backend.py"]["flashinfer.BatchPrefillWithPagedKVCacheWrapper"]
    )


@needs_sglang
def test_the_audit_fails_on_a_module_missing_from_modules(monkeypatch):
    monkeypatch.setattr(flashinfer_slim, "MODULES", tuple(m for m in flashinfer_slim.MODULES if m != "quantization"))
    _, problems = flashinfer_slim.audit(Path(SGLANG.origin).parent)
    assert problems == [
        "flashinfer.BatchPrefillWithPagedKVCacheWrapper (sglang/srt/layers/attention/flashinfer_backend.py) "
        "builds quantization, not in MODULES"
    ]


def test_the_audit_reads_every_way_sglang_reaches_flashinfer(tmp_path, monkeypatch):
    sglang = tmp_path / "sglang"
    files = {
        "a.py": "from flashinfer import top_k as _t, BatchDecodeWithPagedKVCacheWrapper\nfrom .x import y\n",
        "b.py": 'f = LazyImport("flashinfer.sampling", "top_k_renorm_probs")\nLazyImport("torch", "x")\n',
        "c.py": "import flashinfer.quantization\ndef f(x):\n    return flashinfer.quantization.segment_packbits(x)\n",
        "d.cuh": "#include <flashinfer/sampling.cuh>\n#include <flashinfer/norm.cuh>\n#include <cub/cub.cuh>\n",
    }
    for name, text in files.items():
        (sglang / name).parent.mkdir(parents=True, exist_ok=True)
        (sglang / name).write_text(text)
    monkeypatch.setattr(flashinfer_slim, "SGLANG_FILES", {"a.py": "", "b.py": "", "c.py": "", "gone.py": ""})
    monkeypatch.setattr(flashinfer_slim, "SGLANG_JIT_FILES", ("d.cuh",))
    table, problems = flashinfer_slim.audit(sglang)
    assert table["a.py"] == {
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper": ("decode",),
        "flashinfer.top_k": ("topk",),
    }
    assert table["b.py"] == {"flashinfer.sampling.top_k_renorm_probs": ("sampling",)}
    assert table["d.cuh"]["#include <flashinfer/sampling.cuh>"] == (flashinfer_slim.HEADERS["flashinfer/sampling.cuh"],)
    assert problems == [
        "sglang/c.py uses flashinfer.quantization.segment_packbits, which FLASHINFER_API does not map: audit its JIT "
        "modules",
        "sglang/gone.py is gone: audit what replaced it",
        "sglang/d.cuh includes <flashinfer/norm.cuh>, which HEADERS lacks",
    ]


@needs_tar
def test_slim_archive_lists_every_module_and_its_sources():
    with tarfile.open(TAR) as t:
        names = set(t.getnames())
        slim = json.load(t.extractfile("flashinfer/SLIM.json"))
    assert set(slim["modules"]) == set(flashinfer_slim.MODULES), (
        "rebuild the kit: bash benchmarks/device/flashinfer_kit.sh"
    )
    for key, mod in slim["modules"].items():
        assert {s for s in mod["sources"] if s not in names} == set(), key
    assert {
        "flashinfer/data/csrc/quantization.cu",
        "flashinfer/data/csrc/flashinfer_quantization_binding.cu",
        "flashinfer/data/include/flashinfer/quantization.cuh",
        *flashinfer_slim.HEADERS.values(),
    } <= names
    assert all(any(n.startswith(d + "/") for n in names) for d in flashinfer_slim.SGLANG_INCLUDE_DIRS)


@needs_tar
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="generating the JIT sources needs torch")
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
        [sys.executable, "-m", "benchmarks", "flashinfer-slim", "check", str(TAR)],
        capture_output=True,
        text=True,
        env=lab_env({**os.environ, "FI_SLIM_DEPS": str(deps)}),
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert f"{len(flashinfer_slim.MODULES)} modules, 0 problems" in r.stdout
