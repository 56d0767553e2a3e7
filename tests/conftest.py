import os
import random
import sys
from pathlib import Path

import pytest
import torch

# the lab (benchmarks/) is not installed: the checkout's root on the path, as `python -m pytest` from it puts it
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The tests use tiny tensors: intra-op fan-out only costs time (a lot on a loaded 2-core machine).
torch.set_num_threads(1)

if not torch.cuda.is_available():
    # On a CPU machine the Triton kernels run under the interpreter. The mode is fixed when a
    # kernel is decorated, so every kernel module is imported here, before any test module can
    # import triton in compiled mode; the variable is then restored, so that dispatching code
    # takes the PyTorch references unless a test sets TRITON_INTERPRET=1 itself.
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import importlib
    import pkgutil

    import triton.language  # noqa: F401

    import sglang_lilicorr.kernels as kernels

    for module in pkgutil.iter_modules(kernels.__path__):
        importlib.import_module(f"{kernels.__name__}.{module.name}")
    if saved is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = saved


SEED = int(
    os.environ.get("LILICORR_TEST_SEED", "0")
)  # the inputs of every seeded test; replay a failure with its value


def pytest_report_header(config):
    return f"LILICORR_TEST_SEED={SEED} (set it to run the seeded tests on other inputs)"


@pytest.fixture(autouse=True)
def _seeded_global_rngs():
    """Every test starts torch's and Python's global generators from the session's seed."""
    random.seed(SEED)
    torch.manual_seed(SEED)


@pytest.fixture
def seed(monkeypatch) -> int:
    """The session's seed (LILICORR_TEST_SEED, default 0); the Triton paths see TRITON_INTERPRET=1 on a CPU machine."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return SEED


@pytest.fixture
def gen(seed) -> torch.Generator:
    """A CPU generator seeded by `seed`."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def bench_in_process(monkeypatch):
    """The lab steps' `lilicorr bench` calls (benchmarks/testbed/common.bench) run in this process, from the same
    folder, with the same arguments and exit code, and no timeout (the tests that use it set no deadline that cuts
    one): a subprocess would import torch again for each run and report. test_testbed's test_pipeline_end_to_end runs
    its first speed call's as subprocesses."""
    from benchmarks.testbed import common
    from sglang_lilicorr import cli

    def bench(*argv, cwd, timeout=None):
        with monkeypatch.context() as m:
            m.chdir(cwd)
            return cli.main(["bench", *argv])

    monkeypatch.setattr(common, "bench", bench)


@pytest.fixture(params=["installed", "device"])
def sm90_triton(request) -> str:
    """Which Triton lowers a kernel in an sm_90 build check (tests/sm90_build.py): the one installed
    beside torch, or the GPU image's."""
    return request.param


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (run on the GPU machine; results go in tests/gpu_results/)"
    )
    config.addinivalue_line("markers", "sglang: needs the sglang package importable")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
