"""Helpers the testbed's steps share: copies into $OUT, the GPUs."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path


def to_out(out: str | None, *paths: Path) -> None:
    """Copy small files into $OUT (the device call brings them back)."""
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    for p in paths:
        if p.exists():
            shutil.copy(p, Path(out) / p.name)
            print(f"-> {Path(out) / p.name} ({p.stat().st_size / 2**20:.2f} MiB)")


def free_port() -> int:
    """A loopback port that is free now (the OS picks it): for a torchrun rendezvous, never a fixed one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpus() -> int:
    import torch

    return max(1, torch.cuda.device_count())


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def set_flags(args: list[str], flags: dict[str, str]) -> list[str]:
    """Server arguments with each --flag's value replaced where present, appended where not."""
    args = list(args)
    for flag, value in flags.items():
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def speculation_args(system: str, drafts: Path) -> list[str]:
    """The server flags that speculate with drafts/SYSTEM: none for `base` (plain decoding), SGLang's own DFLASH
    for `dflash`, SGLang's DFLASH with its built-in LiLiCorr head on drafts/lilicorr for `builtin`, this plugin's
    LILICORR for any other name."""
    if system == "base":
        return []
    algorithm = "DFLASH" if system in ("dflash", "builtin") else "LILICORR"
    draft = drafts / ("lilicorr" if system == "builtin" else system)
    return ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(draft),
            "--speculative-draft-attention-backend", "triton"]
