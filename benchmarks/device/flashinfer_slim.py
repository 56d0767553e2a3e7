"""A slimmed flashinfer-python 0.7.2 for the lent GPU machine: only what SGLang 0.5.23's flashinfer
attention backend and flashinfer's sampling kernels JIT-compile, for SmolLM2-135M's shapes (bf16, head_dim 64).

The wheel is 65 MB compressed and 453 MB unpacked (332 MB of it `flashinfer/data`: CUDA sources for every op and
architecture, CUTLASS, CCCL); a device call carries at most 64 MiB. Kept:
- every `.py` file of the package (`import flashinfer` imports most of them; 90 MB, about 7 MiB compressed), and the
  small non-source files beside them (configs, jinja templates), except the MoE kernel-selection artifacts;
- from `flashinfer/data`: the files the JIT modules below open while generating their sources (templates, csrc),
  the HEADERS SGLang's own JIT kernels include, the `#include` closure of both over flashinfer's include path
  (`flashinfer/jit/cpp_ext.py`: data/include, data/csrc, data/cutlass/include, data/cutlass/tools/util/include), and,
  whole, the vendored CCCL include trees (data/cccl/{cub,libcudacxx/include,thrust}: flashinfer puts them before the
  CUDA toolkit's own with -I, so a partial copy would mix two CCCL versions) and data/spdlog/include.
Dropped: the rest of data/ (other ops' and architectures' sources, CUTLASS examples/python/tests, CCCL docs,
benchmarks, python), `.cu`/`.cuh`/... sources under the package outside data/ (experimental kernels), the MoE
artifacts, the dist-info RECORD (the wheel is not pip-installed; the slim tree is unpacked as is).

The JIT modules (MODULES), from an audit of SGLang 0.5.23's source on a LILICORR / DFLASH server on Hopper (sm90)
with --attention-backend flashinfer --sampling-backend flashinfer (a DFLASH draft's attention defaults to the
target's; LILICORR's draft runs on Triton) and flashinfer 0.7.2's Python behind each call (FLASHINFER_API):
- decode: BatchDecodeWithPagedKVCacheWrapper (SGLang's decode wrappers, fast_decode_plan; tensor cores off at GQA
  group 3 with a bf16 KV cache);
- prefill_fa2_primary: BatchPrefillWithPagedKVCacheWrapper, backend "fa2" (extend, target verify, the DFlash draft's
  non-causal block); prefill_fa2_paged_indep: the same wrapper's independent-stride module, built when the k and v
  caches' strides differ;
- quantization: packbits / segment_packbits, which the paged wrapper's plan(custom_mask=...) runs to pack a mask
  (EAGLE's tree verify, SGLang's SWA-prefix and cross-attention masks; SGLang plans a DFLASH verify on flashinfer
  causal, without a mask);
- prefill_fa3: BatchPrefillWithRaggedKVCacheWrapper, backend "auto" (FA3 on sm90 at head_dim 64);
- cascade: merge_state (the ragged and paged parts of an extend with a prefix);
- sampling: the sampler's top_k_top_p_sampling_from_probs ("joint") and min_p_sampling_from_probs, the top-k / top-p
  renorms of DFlash's sampled verify (sglang.kernels.ops.sampling.renorm), softmax (the DFlash selector's sampled
  accept);
- topk: top_k (sorted and deterministic): the candidate selector of DFlash2 drafts
  (DFlash2DraftModel.compute_candidates); DFLASH, the built-in LiLiCorr and LILICORR never call it (the built-in takes
  its own top-K with the partition);
- page: append_paged_kv_cache; SGLang 0.5.23 does not call it (it writes the KV cache with its own kernels): a spare.
SGLang's own JIT kernel for DFlash's sampled verify (sglang/kernels/jit/csrc/speculative/sampling.cuh) includes
<flashinfer/sampling.cuh> from this tree (HEADERS) and needs SGLANG_INCLUDE_DIRS to exist. Generating the modules'
sources needs no GPU: `specs` imports flashinfer and calls the generators under an audit hook that records every file
they open. `audit` re-reads SGLang's files (SGLANG_FILES, SGLANG_JIT_FILES) and fails on a flashinfer name or header
they use that FLASHINFER_API / HEADERS do not cover, or on a module that MODULES lacks.

  python -m benchmarks flashinfer-slim specs PKG_PARENT WORKSPACE   # JSON: per module, name, sources, files opened
  python -m benchmarks flashinfer-slim build WHEEL OUT_TAR          # writes the slim tree as OUT_TAR (tar, xz)
  python -m benchmarks flashinfer-slim check TAR                    # every module's sources and includes present
  python -m benchmarks flashinfer-slim audit [SGLANG_DIR]           # SGLang's flashinfer calls -> MODULES
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import posixpath
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from .. import lab_env

VERSION = "0.7.2"
# SmolLM2-135M (target) and its drafts: bf16 q/kv/o, int32 indices, head_dim 64 (qk and vo), no RoPE in the kernel
# (pos_encoding_mode 0), no sliding window, no logits soft-cap; the prefill modules also take use_fp16_qk_reduction.
DTYPE_ARGS = ("bfloat16", "bfloat16", "bfloat16", "int32", 64, 64, 0, False, False)
MODULES = (
    "decode",
    "prefill_fa2_primary",
    "prefill_fa2_paged_indep",
    "prefill_fa3",
    "sampling",
    "cascade",
    "page",
    "topk",
    "quantization",
)
# What SGLang 0.5.23 calls on this path (files under sglang/, the reason each is on it) ...
SGLANG_FILES = {
    "srt/layers/attention/flashinfer_backend.py": "the target's attention; a DFLASH draft's too (its default)",
    "srt/layers/sampler.py": "--sampling-backend flashinfer (top-k/top-p, min-p)",
    "kernels/ops/sampling/renorm.py": "top-k / top-p renorm of DFlash's sampled verify "
    "(srt/speculative/dflash_utils.py)",
    "kernels/cake_kernels/sampling.py": "the sampler's softmax (flashinfer's only on sm103)",
    "srt/models/dflash.py": "the DFlash / LiLiCorr draft's candidate selector (top-k)",
    "kernels/ops/speculative/dspark/dspark_accept.py": "the DFlash selector's sampled accept (SoftmaxTemp)",
    "srt/layers/layernorm.py": "imports flashinfer.norm at import time",
    "srt/utils/common.py": "sets flashinfer's JIT log level",
}
# ... its JIT sources that include flashinfer's headers (speculative sampling: DFlash's sampled verify) ...
SGLANG_JIT_FILES = (
    "kernels/jit/csrc/speculative/sampling.cuh",
    "kernels/jit/include/sgl_kernel/speculative/sampling.cuh",
)
# ... the headers (as included -> in the package) and the include folders SGLang's JIT requires
# (sglang/kernels/jit/utils/deps.py, get_flashinfer_include_paths: it raises when one is missing) ...
HEADERS = {"flashinfer/sampling.cuh": "flashinfer/data/include/flashinfer/sampling.cuh"}
SGLANG_INCLUDE_DIRS = (
    "flashinfer/data/include",
    "flashinfer/data/csrc",
    "flashinfer/data/cutlass/include",
    "flashinfer/data/cutlass/tools/util/include",
    "flashinfer/data/spdlog/include",
)
# ... and, per flashinfer name those files use, the MODULES it can JIT-build on sm90 at these shapes (flashinfer 0.7.2).
FLASHINFER_API = {
    # use_tensor_cores=False (GQA group 3 < 4, bf16 KV); True (SGLANG_FLASHINFER_USE_TENSOR_CORE=true, deterministic
    # inference) would run it on prefill_fa2_primary instead
    "flashinfer.BatchDecodeWithPagedKVCacheWrapper": ("decode",),
    "flashinfer.fast_decode_plan": ("decode",),  # replans with the decode wrapper's cached module
    # backend "fa2"; the independent-stride module when k and v strides differ (paged_run); plan(custom_mask=...)
    # packs the mask with segment_packbits (quantization)
    "flashinfer.BatchPrefillWithPagedKVCacheWrapper": (
        "prefill_fa2_primary",
        "prefill_fa2_paged_indep",
        "quantization",
    ),
    # backend "auto": FA3 on sm90 at head_dim 64 without a custom mask (FA2, prefill_fa2_primary, elsewhere)
    "flashinfer.BatchPrefillWithRaggedKVCacheWrapper": ("prefill_fa3",),
    "flashinfer.cascade.merge_state": ("cascade",),
    "flashinfer.decode._grouped_size_compiled_for_decode_kernels": (),  # not in 0.7.2: ImportError, caught
    "flashinfer.sampling.min_p_sampling_from_probs": ("sampling",),
    # filter_apply_order="joint" (the "top_k_first" fast path would also build topk)
    "flashinfer.sampling.top_k_top_p_sampling_from_probs": ("sampling",),
    "flashinfer.sampling.top_k_renorm_probs": ("sampling",),
    "flashinfer.sampling.top_p_renorm_probs": ("sampling",),
    "flashinfer.sampling.softmax": ("sampling",),  # on sm90 (sm100 / sm103: cake_blackwell_softmax)
    "flashinfer.top_k": ("topk",),
    # flashinfer.norm: LayerNorm and the FP8 RMSNorms only; SmolLM2 and its drafts run sgl_kernel's bf16 RMSNorm
    "flashinfer.norm.layernorm": (),
    "flashinfer.norm.rmsnorm_quant": (),
    "flashinfer.norm.fused_add_rmsnorm_quant": (),
    "flashinfer.jit.core.logger": (),
}
INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
SOURCE_EXT = (".cu", ".cuh", ".h", ".hpp", ".inl", ".cc", ".cpp", ".c", ".ptx", ".cubin", ".so", ".md")
DROP_PREFIXES = ("flashinfer/fused_moe/backends/cudnn_frost/artifacts/",)
WHOLE = (
    "flashinfer/data/cccl/cub/",
    "flashinfer/data/cccl/libcudacxx/include/",
    "flashinfer/data/cccl/thrust/",
    "flashinfer/data/spdlog/include/",
)
# flashinfer's include search order for data/ (jit/cpp_ext.py: CCCL with -I first, then the system includes)
SEARCH = (
    "flashinfer/data/cccl/cub",
    "flashinfer/data/cccl/libcudacxx/include",
    "flashinfer/data/cccl/thrust",
    "flashinfer/data/include",
    "flashinfer/data/csrc",
    "flashinfer/data/cutlass/include",
    "flashinfer/data/cutlass/tools/util/include",
    "flashinfer/data/spdlog/include",
)


def _specs_main(workspace: str) -> None:
    """Run inside a python whose sys.path has the flashinfer to inspect first: print the MODULES' JSON."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", workspace)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")  # no GPU needed to generate sources
    opened: set[str] = set()

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            opened.add(os.path.realpath(os.fspath(args[0])))

    import torch
    import flashinfer
    from flashinfer.jit.attention import modules as m
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.jit.quantization import gen_quantization_module
    from flashinfer.jit.sampling import gen_sampling_module
    from flashinfer.jit.topk import gen_topk_module

    root = os.path.realpath(os.path.dirname(os.path.dirname(flashinfer.__file__)))
    a = tuple(getattr(torch, x) if isinstance(x, str) else x for x in DTYPE_ARGS)
    gens = {
        "decode": lambda: m.gen_batch_decode_module(*a),
        "prefill_fa2_primary": lambda: m._gen_batch_prefill_primary_module("fa2", *a, False),
        "prefill_fa2_paged_indep": lambda: m._gen_batch_prefill_independent_paged_module("fa2", *a, False),
        "prefill_fa3": lambda: m.gen_batch_prefill_module("fa3", *a, False),
        "sampling": gen_sampling_module,
        "cascade": gen_cascade_module,
        "page": gen_page_module,
        "topk": gen_topk_module,
        "quantization": gen_quantization_module,  # packbits, segment_packbits
    }
    sys.addaudithook(hook)
    out = {}
    for key in MODULES:
        opened.clear()
        spec = gens[key]()
        out[key] = {
            "name": spec.name,
            "sources": [os.path.realpath(p) for p in spec.sources],
            "include_dirs": [os.path.realpath(p) for p in (spec.extra_include_dirs or [])],
            "opened": sorted(
                os.path.relpath(p, root) for p in opened if p.startswith(root + os.sep) and os.path.isfile(p)
            ),
        }
    json.dump({"root": root, "version": flashinfer.__version__, "modules": out}, sys.stdout, indent=1)


def run_specs(pkg_parent: Path, workspace: Path, python: str = sys.executable) -> dict:
    """The MODULES' specs, generated by a child python importing the flashinfer under pkg_parent."""
    env = lab_env(
        dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(pkg_parent)] + [p for p in (os.environ.get("FI_SLIM_DEPS"), os.environ.get("PYTHONPATH")) if p]
            ),
            FLASHINFER_WORKSPACE_BASE=str(workspace),
        )
    )
    argv = [python, "-m", "benchmarks", "flashinfer-slim", "_specs", str(workspace)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"flashinfer_slim: generating the JIT modules' sources failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def include_closure(start: dict[str, bytes], files: dict[str, bytes] | None, read) -> tuple[set[str], set[str]]:
    """Package paths (flashinfer/data/...) reached from the start files' #includes; and the includes not found
    there (from the CUDA toolkit, tvm-ffi, python or the system). start: {name: text}; read(path) -> bytes | None."""
    found, outside, seen_local = set(), set(), set()
    todo = [(name, name if name.startswith("flashinfer/") else None, text) for name, text in start.items()]
    while todo:
        name, pkgpath, text = todo.pop()
        for kind, target in INCLUDE_LINE.findall(text.decode(errors="replace")):
            candidates = []
            if kind == '"' and pkgpath is None:  # a generated source: its own folder on disk first
                local = os.path.join(os.path.dirname(name), target)
                if os.path.isfile(local) and local not in seen_local:
                    seen_local.add(local)
                    todo.append((local, None, Path(local).read_bytes()))
                    continue
            if kind == '"' and pkgpath is not None:
                candidates.append(posixpath.normpath(posixpath.join(posixpath.dirname(pkgpath), target)))
            candidates += [posixpath.normpath(posixpath.join(d, target)) for d in SEARCH]
            for c in candidates:
                if c in found:
                    break
                data = read(c)
                if data is not None:
                    found.add(c)
                    todo.append((c, c, data))
                    break
            else:
                outside.add(target)
    return found, outside


def slim_names(names: list[str], specs: dict, read) -> tuple[list[str], dict]:
    """The wheel members kept, and a report."""
    keep = set()
    for n in names:
        if n.endswith("/") or not n.startswith("flashinfer/"):
            continue
        if n.startswith("flashinfer/data/"):
            if n.startswith(WHOLE):
                keep.add(n)
            continue
        if n.startswith(DROP_PREFIXES) or (n.endswith(SOURCE_EXT) and not n.endswith(".py")):
            continue
        keep.add(n)
    start, opened = {}, set(HEADERS.values())
    for mod in specs["modules"].values():
        opened.update(o for o in mod["opened"] if o.startswith("flashinfer/"))
        for s in mod["sources"]:
            rel = os.path.relpath(s, specs["root"])
            if rel.startswith("flashinfer/"):
                opened.add(rel)
            else:
                start[s] = Path(s).read_bytes()
    for o in sorted(opened):
        data = read(o)
        if data is None:
            raise SystemExit(f"flashinfer_slim: {o} was opened by a generator but is not in the wheel")
        start[o] = data
    found, outside = include_closure(start, None, read)
    keep |= opened | found
    report = {"opened": sorted(opened), "closure": len(found), "outside": sorted(outside)}
    return sorted(keep), report


def build(wheel: Path, out_tar: Path, work: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version:\s*(\S+)", z.read(meta).decode(), re.M).group(1)
        if version != VERSION:
            raise SystemExit(f"flashinfer_slim: {wheel} is flashinfer-python {version}, SGLang 0.5.23 pins {VERSION}")
        full = work / "full"
        if not (full / "flashinfer" / "__init__.py").is_file():
            z.extractall(full)
        specs = run_specs(full, work / "ws")
        names = z.namelist()
        nameset = set(names)

        def read(p):
            return z.read(p) if p in nameset else None

        keep, report = slim_names(names, specs, read)
        keep_dist = [n for n in names if ".dist-info/" in n and not n.endswith("RECORD")]
        tmp = out_tar.with_suffix(".tmp")
        with tarfile.open(tmp, "w:xz", preset=6) as t:
            for n in keep + keep_dist:
                info = tarfile.TarInfo(n)
                data = z.read(n)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                t.addfile(info, io.BytesIO(data))
            listing = json.dumps(
                {
                    "version": VERSION,
                    "modules": {
                        k: {
                            "name": v["name"],
                            # in the package (a generated source lives in flashinfer's cache, not here)
                            "sources": [
                                r
                                for r in (os.path.relpath(x, specs["root"]) for x in v["sources"])
                                if r.startswith("flashinfer/")
                            ],
                            "opened": v["opened"],
                        }
                        for k, v in specs["modules"].items()
                    },
                    "headers": HEADERS,
                    "outside_includes": report["outside"],
                },
                indent=1,
            ).encode()
            info = tarfile.TarInfo("flashinfer/SLIM.json")
            info.size, info.mode, info.mtime = len(listing), 0o644, 0
            t.addfile(info, io.BytesIO(listing))
        os.replace(tmp, out_tar)
        size_in = sum(z.getinfo(n).file_size for n in keep + keep_dist)
    return {
        "files": len(keep) + len(keep_dist),
        "unpacked": size_in,
        "tar": out_tar.stat().st_size,
        "opened": len(report["opened"]),
        "closure": report["closure"],
        "outside": report["outside"],
    }


def check(tar: Path) -> list[str]:
    """Unpack TAR into a temporary folder, generate the MODULES' sources from it, and return what is missing: a
    module (not built into TAR), a module's source file, a file a generator opened outside the slim tree, one of the
    HEADERS or SGLANG_INCLUDE_DIRS, or an #include that resolves in the full wheel's layout but not in the slim tree
    (an include found nowhere is left to the CUDA toolkit)."""
    problems = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        with tarfile.open(tar) as t:
            t.extractall(d / "pkg", filter="data")
        slim = json.loads((d / "pkg" / "flashinfer" / "SLIM.json").read_text())
        specs = run_specs(d / "pkg", d / "ws")
        if os.path.realpath(specs["root"]) != os.path.realpath(d / "pkg"):
            problems.append(f"imported flashinfer from {specs['root']}, not from the slim tree")
        for key in MODULES:
            mod = specs["modules"][key]
            for s in mod["sources"]:
                if not Path(s).is_file():
                    problems.append(f"{key}: source {s} missing")
            if key not in slim["modules"]:
                problems.append(f"{key}: not in the archive (built before MODULES had it: rebuild the kit)")
                continue
            for o in slim["modules"][key]["opened"]:
                if not (d / "pkg" / o).is_file():
                    problems.append(f"{key}: {o} (opened by its generator in the full wheel) missing")

        def read(p):
            f = d / "pkg" / p
            return f.read_bytes() if f.is_file() else None

        for inc, h in HEADERS.items():
            if not (d / "pkg" / h).is_file():
                problems.append(f"header {h} (SGLang's JIT includes <{inc}>) missing")
        for x in SGLANG_INCLUDE_DIRS:
            if not (d / "pkg" / x).is_dir():
                problems.append(f"folder {x} (SGLang's JIT requires it) missing")
        start = {h: read(h) for h in HEADERS.values() if read(h) is not None}
        for m in specs["modules"].values():
            for s in filter(os.path.isfile, m["sources"]):  # a missing one is reported above
                rel = os.path.relpath(s, specs["root"])
                start[rel if rel.startswith("flashinfer/") else s] = Path(s).read_bytes()
        _, outside = include_closure(start, None, read)
        for inc in sorted(set(outside) - set(slim["outside_includes"])):
            problems.append(f"#include {inc} resolves in the full wheel but not in the slim tree")
    return problems


def flashinfer_names(path: Path) -> set[str]:
    """The flashinfer names a Python file uses: `from flashinfer.x import n` (flashinfer.x.n), SGLang's
    LazyImport("flashinfer.x", "n"), and attribute chains from the name `flashinfer` (flashinfer.x.n(...))."""
    tree = ast.parse(path.read_text(), str(path))
    names, chains = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "flashinfer" and not n.level:
            names |= {f"{n.module}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Call) and len(n.args) >= 2:
            a, b = n.args[:2]
            if (
                isinstance(a, ast.Constant)
                and isinstance(b, ast.Constant)
                and isinstance(a.value, str)
                and isinstance(b.value, str)
                and a.value.split(".")[0] == "flashinfer"
            ):
                names.add(f"{a.value}.{b.value}")
        elif isinstance(n, ast.Attribute):
            parts, x = [], n
            while isinstance(x, ast.Attribute):
                parts.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name) and x.id == "flashinfer":
                chains.add(".".join(["flashinfer", *reversed(parts)]))
    names |= {c for c in chains if not any(o.startswith(c + ".") for o in chains)}  # the longest chains only
    return names


def audit(sglang_dir: Path) -> tuple[dict, list[str]]:
    """Per SGLANG_FILES / SGLANG_JIT_FILES file, the flashinfer names (headers) it uses and the MODULES they build;
    and the problems: a file gone, a name FLASHINFER_API does not map, a header HEADERS lacks, a module not in
    MODULES."""
    table, problems = {}, []
    for rel in SGLANG_FILES:
        f = sglang_dir / rel
        if not f.is_file():
            problems.append(f"sglang/{rel} is gone: audit what replaced it")
            continue
        for name in sorted(flashinfer_names(f)):
            if name not in FLASHINFER_API:
                problems.append(f"sglang/{rel} uses {name}, which FLASHINFER_API does not map: audit its JIT modules")
                continue
            table.setdefault(rel, {})[name] = FLASHINFER_API[name]
            problems += [
                f"{name} (sglang/{rel}) builds {m}, not in MODULES" for m in FLASHINFER_API[name] if m not in MODULES
            ]
    for rel in SGLANG_JIT_FILES:
        f = sglang_dir / rel
        if not f.is_file():
            problems.append(f"sglang/{rel} is gone: audit what replaced it")
            continue
        for _, inc in INCLUDE_LINE.findall(f.read_text(errors="replace")):
            if inc.split("/")[0] == "flashinfer":
                table.setdefault(rel, {})[f"#include <{inc}>"] = (HEADERS.get(inc, "?"),)
                if inc not in HEADERS:
                    problems.append(f"sglang/{rel} includes <{inc}>, which HEADERS lacks")
    return table, problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_specs"]:
        _specs_main(argv[1])
        return 0
    if argv[:1] == ["specs"] and len(argv) == 3:
        json.dump(run_specs(Path(argv[1]), Path(argv[2])), sys.stdout, indent=1)
        return 0
    if argv[:1] == ["build"] and len(argv) == 3:
        out = Path(argv[2])
        with tempfile.TemporaryDirectory(dir=out.parent) as w:
            r = build(Path(argv[1]), out, Path(w))
        print(json.dumps(r))
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        problems = check(Path(argv[1]))
        for p in problems:
            print("flashinfer_slim: MISSING", p)
        print(f"flashinfer_slim check: {len(MODULES)} modules, {len(problems)} problems")
        return 1 if problems else 0
    if argv[:1] == ["audit"] and len(argv) <= 2:
        if len(argv) == 2:
            sglang_dir = Path(argv[1])
        else:
            spec = importlib.util.find_spec("sglang")
            if spec is None or spec.origin is None:
                print("flashinfer_slim audit: no sglang importable here: name its folder", file=sys.stderr)
                return 2
            sglang_dir = Path(spec.origin).parent
        table, problems = audit(sglang_dir)
        for rel, names in table.items():
            for name, mods in names.items():
                print(f"sglang/{rel}: {name} -> {', '.join(mods) or '(no JIT module)'}")
        used = {m for names in table.values() for mods in names.values() for m in mods if m in MODULES}
        for p in problems:
            print("flashinfer_slim: AUDIT", p)
        print(
            f"flashinfer_slim audit: {len(used)} of {len(MODULES)} modules reached"
            f" (not: {', '.join(m for m in MODULES if m not in used) or 'none'}), {len(problems)} problems"
        )
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2
