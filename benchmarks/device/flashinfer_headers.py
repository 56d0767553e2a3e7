"""The flashinfer headers that SGLang 0.5.23's DFlash sampling verification compiles against, as a headers-only
`flashinfer` package for the lent GPU machine (it has no flashinfer, and a call carries at most 64 MiB: the
flashinfer-python 0.7.2 wheel that SGLang 0.5.23 pins is 65 MB).

SGLang verifies a sampled (T > 0) DFlash block by exact rejection sampling in its JIT kernel
`tree_speculative_sampling_target_only` (sglang/kernels/ops/speculative/sampling.py), whose source includes
<flashinfer/sampling.cuh>. SGLang finds those headers through the `flashinfer` package's data/ folders
(sglang/kernels/jit/utils/deps.py, which requires data/include, data/csrc, data/cutlass/include,
data/cutlass/tools/util/include and data/spdlog/include to exist). This writes OUT/flashinfer/: an __init__.py with
no Python API, data/include/flashinfer/ with the include closure of sampling.cuh taken from the wheel, the four
other folders empty, and HEADERS_ONLY (the marker that lets a later run replace it).

On the GPU machine `benchmarks/device/check_lib.sh` (use_flashinfer_headers) copies it into the kit's site folder and
sets SGLANG_IS_FLASHINFER_AVAILABLE=false: SGLang's is_flashinfer_available(), which would pick flashinfer kernels for
layers and sampling, stays False, while the DFlash verifier finds the headers and the kit's patched renorm, which cannot
import flashinfer.sampling, takes its torch fallbacks.

  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \\
      -d /tmp/fi flashinfer-python==0.7.2
  python -m benchmarks flashinfer-headers /tmp/fi/flashinfer_python-0.7.2-py3-none-any.whl --out .dev/flashinfer_headers
"""

from __future__ import annotations

import argparse
import posixpath
import re
import shutil
import sys
import zipfile
from pathlib import Path

VERSION = "0.7.2"  # flashinfer-python as SGLang 0.5.23 pins it
INCLUDE = "flashinfer/data/include/"
ROOTS = ("flashinfer/sampling.cuh",)  # what SGLang's speculative sampling kernel includes, under INCLUDE
EMPTY = ("csrc", "cutlass/include", "cutlass/tools/util/include", "spdlog/include")  # under flashinfer/data
MARKER = "HEADERS_ONLY"
INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


class HeadersError(Exception):
    """A wheel or output folder this tool cannot use; the message names it and the fix."""


def wheel_version(wheel: zipfile.ZipFile) -> str:
    metadata = next((n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")), None)
    if metadata is None:
        raise HeadersError(
            f"{wheel.filename}: no .dist-info/METADATA, not a wheel; download flashinfer-python=={VERSION}."
        )
    found = re.search(r"^Version:\s*(\S+)", wheel.read(metadata).decode(), re.M)
    return found.group(1) if found else "unknown"


def include_closure(wheel: zipfile.ZipFile, roots=ROOTS) -> list[str]:
    """Every header under INCLUDE that the roots include, directly or not ("..." relative to the including file,
    <flashinfer/...> relative to INCLUDE; other <...> come from the CUDA toolkit); paths relative to INCLUDE."""
    names = set(wheel.namelist())
    todo, seen = list(roots), set()
    while todo:
        header = todo.pop()
        if header in seen:
            continue
        if INCLUDE + header not in names:
            raise HeadersError(
                f"{wheel.filename}: {INCLUDE + header} is included but not in the wheel; "
                f"use flashinfer-python=={VERSION}."
            )
        seen.add(header)
        for kind, target in INCLUDE_LINE.findall(wheel.read(INCLUDE + header).decode(errors="replace")):
            if kind == '"':
                todo.append(posixpath.normpath(posixpath.join(posixpath.dirname(header), target)))
            elif target.startswith("flashinfer/"):
                todo.append(target)
    return sorted(seen)


def write(wheel_path: Path, out: Path) -> list[str]:
    """OUT/flashinfer from the wheel (module docstring); the headers written."""
    try:
        wheel = zipfile.ZipFile(wheel_path)
    except (OSError, zipfile.BadZipFile) as e:
        raise HeadersError(f"{wheel_path}: not a readable wheel ({e}); download flashinfer-python=={VERSION}.") from e
    with wheel:
        version = wheel_version(wheel)
        if version != VERSION:
            raise HeadersError(
                f"{wheel_path}: flashinfer-python {version}, but SGLang 0.5.23 compiles against {VERSION}; "
                f"download flashinfer-python=={VERSION}."
            )
        headers = include_closure(wheel)
        package = out / "flashinfer"
        if package.exists() and not (package / MARKER).is_file():
            raise HeadersError(f"{package} exists and was not written by this tool; choose another --out.")
        shutil.rmtree(package, ignore_errors=True)
        for header in headers:
            target = package / "data" / "include" / header
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wheel.read(INCLUDE + header))
    for folder in EMPTY:
        (package / "data" / folder).mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        f'"""flashinfer {VERSION} headers only (benchmarks/device/flashinfer_headers.py): no Python API."""\n'
    )
    (package / MARKER).write_text("".join(h + "\n" for h in headers))
    return headers


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", type=Path, help=f"flashinfer_python-{VERSION}-py3-none-any.whl")
    p.add_argument(
        "--out", type=Path, required=True, help="folder that receives flashinfer/ (e.g. .dev/flashinfer_headers)"
    )
    args = p.parse_args(argv)
    try:
        headers = write(args.wheel, args.out)
    except HeadersError as e:
        print(f"flashinfer_headers: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in (args.out / "flashinfer").rglob("*") if f.is_file())
    print(f"{args.out / 'flashinfer'}: {len(headers)} headers, {size / 1024:.0f} KiB")
    return 0
