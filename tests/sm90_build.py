"""Kernels lowered to sm_90 without a GPU: Triton compiles in a fresh process (a CPU test session
runs Triton under its interpreter, which compiles nothing) and its bundled ptxas reports registers,
spills and shared memory. A test hands `check_in_fresh_process` a script that calls `build` and
exits non-zero on a failed check.

Every build runs under two Tritons (the `sm90_triton` fixture): the one installed beside torch here,
and the GPU machine's (Triton 3.6 there), which scripts/install.sh pins and puts in
<venv>/device-triton. They differ in what their front ends accept (Triton 3.6 rejects a string
default of a constexpr argument that 3.8 takes), so a kernel that builds here may not on the GPU.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def build(fn, types, constexprs, *, aligned=(), **options) -> dict:
    """fn (a @triton.jit kernel) with argument `types`, `constexprs`, the argument positions
    `aligned` divisible by 16, launch `options` -> {"ptx", "registers", "spills", "shared"}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    source = ASTSource(
        fn=fn,
        signature=dict(zip(fn.arg_names, types)),
        constexprs=constexprs,
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        Path(path).write_text(ptx)
        info = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", path, "-o", path + ".cubin"],
            capture_output=True,
            text=True,
        ).stderr
    return {
        "ptx": ptx,
        "registers": max((int(n) for n in re.findall(r"Used (\d+) registers", info)), default=0),
        "spills": sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", info)),
        "shared": kernel.metadata.shared,
    }


def device_triton_path() -> Path:
    """Where scripts/install.sh puts the GPU image's Triton (its version, pinned there, in .version)."""
    return Path(sys.prefix) / "device-triton"


def check_in_fresh_process(script: str, triton: str = "installed") -> str:
    """Runs `script` without TRITON_INTERPRET (this folder importable), under the installed Triton
    or the GPU image's ("device") -> its stdout; skips where Triton's ptxas is unavailable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(Path(__file__).parent), env.get("PYTHONPATH")]
    if triton == "device":
        where = device_triton_path()
        if not (where / "triton").is_dir() or not (where / ".version").is_file():
            pytest.fail(f"the GPU image's Triton is not in {where}: run scripts/install.sh")
        paths.insert(0, str(where))
        version = (where / ".version").read_text().strip()
        script = f"import triton\nassert triton.__version__ == {version!r}, triton.__version__\n" + script
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    if run.returncode and "ptxas" in run.stderr.lower() and "not found" in run.stderr.lower():
        pytest.skip("triton's ptxas is unavailable here")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run.stdout
