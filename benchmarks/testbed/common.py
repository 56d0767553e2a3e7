"""Helpers the testbed's steps share: copies into $OUT, the GPUs, the target's generator, the run options, background
processes and their folders, the device call's deadline ($TESTBED_DEADLINE), tau through the servers."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

from .variants import LONG, PAPER_RECIPE, SCALE, SCHEDULE


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


# A speed system that serves another with one plugin setting changed (serve_speed.VERIFY_SYSTEMS, WALK_SYSTEMS): the
# system it varies, the setting (verify: LILICORR_VERIFY_ATTENTION, serving/verify_attention.py; walk: LILICORR_WALK,
# serving/proposer.py) and its value.
SERVER_VARIANTS = {
    "dflash_splitkv": ("dflash", "verify", "split-kv"),
    "lilicorr_extend": ("lilicorr", "verify", "extend"),
    "lilicorr_viterbi": ("lilicorr", "walk", "viterbi"),
    "lilicorr_fixed": ("lilicorr", "width", "16"),
    "lilicorr_w1": ("lilicorr", "width", "1"),
}


# the systems SGLang serves without this plugin: DFLASH (a Domino draft too: its config's projector_type) and DSPARK
STOCK_ALGORITHMS = {"dflash": "DFLASH", "builtin": "DFLASH", "domino": "DFLASH", "dspark": "DSPARK"}


def speculation_args(system: str, drafts: Path) -> list[str]:
    """The server flags that speculate with drafts/SYSTEM: none for `base` (plain decoding), SGLang's own DFLASH
    for `dflash` and `domino`, SGLang's DFLASH with its built-in LiLiCorr head on drafts/lilicorr for `builtin`,
    SGLang's DSPARK for `dspark`, this plugin's LILICORR for any other name; a SERVER_VARIANTS name as the system it
    varies."""
    system = SERVER_VARIANTS.get(system, (system,))[0]
    if system == "base":
        return []
    algorithm = STOCK_ALGORITHMS.get(system, "LILICORR")
    draft = drafts / ("lilicorr" if system == "builtin" else system)
    return [
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-draft-attention-backend",
        "triton",
    ]


def variant_env(system: str) -> dict:
    """The environment a speed system's server adds: its setting for a SERVER_VARIANTS name, else nothing (DFLASH as
    SGLang ships it, LILICORR on its defaults)."""
    from sglang_lilicorr.serving.proposer import WALK_ENV
    from sglang_lilicorr.serving.verify_attention import ENV
    from sglang_lilicorr.serving.verify_width import WIDTH_ENV

    if system not in SERVER_VARIANTS:
        return {}
    _, setting, value = SERVER_VARIANTS[system]
    return {{"verify": ENV, "walk": WALK_ENV, "width": WIDTH_ENV}[setting]: value}


# SGLang flags the GPU machine's kit needs (no flashinfer, no flash-attention; ../shared/device): `--server-args`'
# default.
SERVER_ARGS = (
    "--attention-backend triton --sampling-backend pytorch --grammar-backend none "
    "--mem-fraction-static 0.85 --context-length 4096 --cuda-graph-max-bs-decode 256 "
    "--cuda-graph-backend-prefill disabled"
)
# the backends of SERVER_ARGS: a server whose arguments name none of these flags ran them (every call before they
# could be chosen ran SERVER_ARGS)
KIT_BACKENDS = {"attention": "triton", "sampling": "pytorch"}
BACKEND_FLAGS = {"attention": "--attention-backend", "sampling": "--sampling-backend"}


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in a server's argument list (`--flag value` or `--flag=value`; the last one given), or
    None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def backends_of(server_args: str) -> dict:
    """{"attention": ..., "sampling": ...}: the target's attention and the sampling backend a server's arguments
    name, KIT_BACKENDS' where they name none."""
    args = shlex.split(server_args)
    return {key: flag_value(args, flag) or KIT_BACKENDS[key] for key, flag in BACKEND_FLAGS.items()}


def with_backends(server_args: str, attention: str | None = None, sampling: str | None = None) -> str:
    """`server_args` with --attention-backend / --sampling-backend set to those given (None: as they are)."""
    flags = {BACKEND_FLAGS["attention"]: attention, BACKEND_FLAGS["sampling"]: sampling}
    args = shlex.split(server_args)
    for flag in [f for f, v in flags.items() if v]:  # `--flag=value` forms first become `--flag value`
        args = [part for a in args for part in (a.split("=", 1) if a.startswith(flag + "=") else [a])]
    return shlex.join(set_flags(args, {f: v for f, v in flags.items() if v}))


@contextlib.contextmanager
def generator(args, log_dir: Path, tokenizer):
    """SGLang servers, one per GPU; `--engine transformers` runs the target in-process (CPU tests)."""
    if args.engine == "transformers":
        from transformers import AutoModelForCausalLM

        from sglang_lilicorr.train.engine import TransformersGenerator

        yield (
            TransformersGenerator(
                AutoModelForCausalLM.from_pretrained(args.target).eval(), tokenizer.pad_token_id or 0
            ),
            "transformers",
        )
        return
    from sglang_lilicorr.train.engine import SGLangServers

    n = gpus()
    t0 = time.time()
    with SGLangServers.launch(
        args.target,
        n,
        server_args=shlex.split(args.server_args),
        log_dir=log_dir,
        concurrency=getattr(args, "concurrency", 256),
    ) as servers:
        yield (
            servers,
            f"{n} SGLang servers on {device_name()}, started in {time.time() - t0:.0f} s ({args.server_args})",
        )


def scale_and_schedule(args) -> dict:
    """SCALE + SCHEDULE (+ LONG with --long, + PAPER_RECIPE with --paper-recipe) with --override KEY=JSON applied
    (tests shrink the models this way)."""
    options = {
        **SCALE,
        **SCHEDULE,
        **(LONG if getattr(args, "long", False) else {}),
        **(PAPER_RECIPE if getattr(args, "paper_recipe", False) else {}),
    }
    for item in args.override or []:
        key, _, value = item.partition("=")
        if key not in options:
            raise SystemExit(f"--override {item!r}: unknown key; choose from {sorted(options)}.")
        options[key] = json.loads(value)
    return options


def enough_time(step: str, minutes: float) -> None:
    """Refuse to start a step that would not finish inside the device call: $TESTBED_DEADLINE (epoch
    seconds, set at the start of a call) less `minutes`. Exit 4: run the step in the next call."""
    end = os.environ.get("TESTBED_DEADLINE")
    if end and time.time() + 60 * minutes > float(end):
        print(
            f"[{step}] {(float(end) - time.time()) / 60:.1f} min left in this call, {minutes:.1f} needed: "
            "run it in the next call."
        )
        raise SystemExit(4)


def bench(*argv: str, cwd: Path, timeout: float | None = None) -> int:
    """`lilicorr bench ...` run from `cwd`; 124 when it ran past `timeout` seconds (its results so far are kept)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "sglang_lilicorr.cli", "bench", *argv], cwd=cwd, timeout=timeout
        ).returncode
    except subprocess.TimeoutExpired:
        return 124


def served_tau(
    urls: dict,
    runs: dict,
    *,
    eval_prompts: Path,
    results: Path,
    concurrency: int,
    max_tokens: int,
    deadline,
    reserve_s: float,
) -> list[str]:
    """Every evaluation prompt through each speculative server of `urls` ({system: url}; base has no tau) at `runs`
    ({temperature: seeds}) -> `results` (`bench run`, which resumes a results file). Each run ends `reserve_s` before
    the deadline (a paired.Deadline, or None): a run it cuts keeps what it played, one it leaves no time for is not
    started, and both are listed, so a later call of the step goes on. The failures."""
    failed = []
    for system, url in urls.items():
        if system == "base":
            continue
        for temperature, seeds in runs.items():
            if deadline is not None and not deadline.allows(reserve_s + 30):
                failed.append(
                    f"{system} tau at T = {temperature:g}: not run, too near the deadline (call the step again)"
                )
                continue
            rc = bench(
                "run",
                *("--url", url, "--system", system, "--dataset", str(eval_prompts), "--results", str(results)),
                *("--concurrency", str(concurrency), "--temperature", f"{temperature:g}", "--seeds", *map(str, seeds)),
                *("--max-tokens", str(max_tokens), "--warmup", "0", "--request-timeout", "300", "--no-progress"),
                cwd=results.parent,
                timeout=None if deadline is None else max(1.0, deadline.left() - reserve_s),
            )
            if rc:
                failed.append(f"{system} tau at T = {temperature:g}: exit {rc}" + (" (deadline)" if rc == 124 else ""))
    return failed


def cli_flags(options: dict) -> list[str]:
    """{name: value} -> lilicorr CLI flags (--name value; booleans as --name / --no-name)."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def lilicorr(*argv: str) -> list[str]:
    return [sys.executable, "-m", "sglang_lilicorr.cli", *argv]


def start(cmd: list[str], log: Path, gpu_ids: list[int] | None = None, append: bool = False) -> subprocess.Popen:
    """A background process in its own session (it outlives the device call), logging to `log` (after what it
    holds with `append`: a resumed run's log). Runs from WORK, not the checkout, whose plain sglang_lilicorr/ would
    shadow the installed one."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=log.parent,
        stdout=open(log, "a" if append else "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run_folder(path: Path, kind: str = "run") -> Path:
    """The folder of a training run (or a data set, a replay report), claimed as one (ownership.py) before the logs of
    the command that writes it go in: lilicorr writes only into a new or empty folder or one of its kind."""
    from sglang_lilicorr.ownership import claim_folder
    from sglang_lilicorr.train.regenerate import is_recipe_dir

    claim_folder(
        path,
        kind,
        "--out" if kind == "report" else "--output-dir",
        recognise=is_recipe_dir if kind == "dataset" else None,
    )
    return path


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def tail(path: Path, n: int = 5) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file() else ""


def data_files(args) -> tuple[Path, Path]:
    data = Path(args.work) / "data"
    if not (data / "train.jsonl").is_file():
        raise SystemExit(f"{data}/train.jsonl: no training data; run the `data` step first.")
    return data / "train.jsonl", data / "heldout.jsonl"


def training_examples(args, path: Path, max_length: int) -> list:
    """The conversations of `path` as training reads them (tokenized once, then from the cache beside the file)."""
    from transformers import AutoTokenizer

    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.data import load_conversations

    chat_kwargs = TrainConfig.__dataclass_fields__["chat_template_kwargs"].default_factory()
    return load_conversations(path, AutoTokenizer.from_pretrained(args.target), max_length, chat_kwargs)


def run_options(args, **extra) -> dict:
    train, held = data_files(args)
    return {
        "target": args.target,
        "data": str(train),
        "eval_data": str(held),
        "exclude": args.eval_prompts,
        **scale_and_schedule(args),
        **extra,
    }


def alive(pid: int) -> bool:
    """The process exists and has not ended (an unreaped zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


class Step(NamedTuple):
    """A testbed step as run.py's parser assembles it: its name and help line, the function that runs it (args -> exit
    code), and the one that adds its own arguments to its subparser (the shared ones are run.py's)."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
