"""Data-parallel training: the same `train` under two gloo processes (as torchrun sets them up): ranks in
lockstep, gradient accumulation against more ranks at one global batch, resume after a killed rank, and
rank 0 as the only writer."""

import json
import os
import signal
import socket
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from ranks import start_ranks
from sglang_lilicorr.train.data import epoch_batches


def test_ranks_get_disjoint_batches_of_equal_count():
    for n in (3, 10, 17):
        ranks = [epoch_batches(n, 2, seed=0, epoch=1, rank=r, world=2) for r in range(2)]
        assert len(ranks[0]) == len(ranks[1]) >= 1
        for step in range(len(ranks[0])):
            assert len(ranks[0][step]) == len(ranks[1][step]) == 2
            if n >= 4:
                assert not set(ranks[0][step]) & set(ranks[1][step])
    assert epoch_batches(10, 2, 0, 0, 0, 1) != epoch_batches(10, 2, 0, 1, 0, 1)  # reshuffled per epoch


def join_gloo(rank, world, port):
    """This process as rank `rank` of `world`, as torchrun sets one up (the trainer starts the process group)."""
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
        }
    )
    torch.set_num_threads(1)


def _worker(rank, world, port, cfg_kwargs, out):
    join_gloo(rank, world, port)
    from sglang_lilicorr.drafter import DFlashDrafter
    from sglang_lilicorr.train import trainer

    built = []
    original = DFlashDrafter.__init__

    def spy(self, *a, **k):  # keep a handle on this rank's drafter to compare ranks afterwards
        original(self, *a, **k)
        built.append(self)

    DFlashDrafter.__init__ = spy
    metrics = trainer.train(trainer.TrainConfig(**cfg_kwargs))
    fc = built[0].fc.weight.detach()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"step": metrics["step"], "fc_sum": float(fc.double().sum()), "fc_0": fc[0, :4].tolist()}, f)
    torch.distributed.destroy_process_group()


def ddp_options() -> dict:
    """test_train's tiny run (TrainConfig fields) as these tests run it: 4 anchors, logged every step, 48 tokens."""
    from test_train import TINY

    return dict(TINY, num_anchors=4, log_every=1, max_length=48)


def test_two_gloo_ranks_train_in_lockstep(tmp_path):
    from test_train import make_target, write_conversations

    target = make_target(tmp_path / "target")
    data = write_conversations(tmp_path / "train.jsonl", 10)
    cfg = dict(ddp_options(), target=target, data=data, output_dir=str(tmp_path / "run"), max_steps=2, batch_size=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(_worker, (2, port, cfg, str(tmp_path)), 2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["step"] == r1["step"] == 2
    assert r0["fc_0"] == r1["fc_0"] and r0["fc_sum"] == r1["fc_sum"]  # gradients were all-reduced
    assert (tmp_path / "run" / "checkpoints" / "step-00000002" / "trainable.safetensors").is_file()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2  # rank 0 logs only


# --- one global batch, resume, one writer -------------------------------------------------------

WRITE_EVENTS = (
    "os.mkdir",
    "os.rename",
    "os.remove",
    "os.rmdir",
    "shutil.rmtree",
    "os.truncate",
    "os.link",
    "os.symlink",
    "shutil.copyfile",
    "shutil.move",
    "os.chmod",
)


def record_writes(log: list, root: str) -> None:
    """Record every file-system write of this process under `root` (the run's output, its data and its target) from
    now on: Python's audit events (open for writing, mkdir, rename, remove, rmtree, ...), and every call of the two
    savers that write from C (safetensors' save_file, torch.save). Outside it, torch itself makes its compile cache
    folder on import (/tmp/torchinductor_$USER) in every process."""
    import safetensors.torch

    from sglang_lilicorr import checkpoint

    flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event, args):
        if event == "open":
            path, mode, open_flags = args
            writing = (mode and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(open_flags, int) and open_flags & flags
            )
            if writing and str(path).startswith(root):
                log.append((event, str(path)))
        elif event in WRITE_EVENTS and str(args[0]).startswith(root):
            log.append((event, str(args[0])))

    sys.addaudithook(hook)
    for module, name in ((checkpoint, "save_file"), (safetensors.torch, "save_file"), (torch, "save")):
        original = getattr(module, name)
        setattr(
            module,
            name,
            lambda *a, _name=name, _original=original, **k: (log.append((_name, str(a[1:2]))), _original(*a, **k))[1],
        )


class KilledAt:
    """A PhaseTimer whose process kills itself (SIGKILL, no clean-up) as step `step` starts."""

    def __init__(self, base, step: int):
        self.base, self.step = base, step

    def __call__(self, device):
        timer, started = self.base(device), []
        start = timer.start_step

        def start_step():
            started.append(1)
            if len(started) == self.step:
                os.kill(os.getpid(), signal.SIGKILL)
            start()

        timer.start_step = start_step
        return timer


def _run(rank, world, port, cfg_kwargs, kill_rank_at, root):
    """One rank of a run: rank 1 records its writes under `root` and fails if it made any; rank 0 starts 2 s late,
    so that rank 1 would be the first to write anything the run writes (a cache, a clean-up); `kill_rank_at` =
    (rank, step) kills that rank as that step starts."""
    join_gloo(rank, world, port)
    from sglang_lilicorr.train import trainer

    if kill_rank_at is not None and kill_rank_at[0] == rank:
        trainer.PhaseTimer = KilledAt(trainer.PhaseTimer, kill_rank_at[1])
    writes = []
    if rank > 0:
        record_writes(writes, root)
    elif world > 1:
        time.sleep(2)
    trainer.train(trainer.TrainConfig(**cfg_kwargs))
    assert not writes, f"rank {rank} wrote: {writes[:5]}"
    if world > 1:
        torch.distributed.destroy_process_group()


def spawn_run(world: int, cfg: dict, kill_rank_at=None) -> None:
    """The run `cfg` on `world` ranks; writes are watched under the folder that holds its output, data and target."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(cfg["output_dir"])
    start_ranks(_run, (world, port, cfg, kill_rank_at, root), world)


@pytest.fixture(scope="module")
def ddp_case(tmp_path_factory):
    """A tiny target, 10 conversations (8 trained, 2 held out) and the options of a 4-step run whose global batch is
    4 sequences: 2 ranks x batch 2 (saved at steps 2 and 4)."""
    from test_train import make_target, write_conversations

    root = tmp_path_factory.mktemp("ddp")
    target, data = make_target(root / "target"), write_conversations(root / "train.jsonl", 10)
    cfg = dict(ddp_options(), target=target, data=data, max_steps=4, batch_size=2, eval_every=2)
    spawn_run(2, {**cfg, "output_dir": str(root / "two_ranks")})
    return root, cfg


def final_weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "step-00000004" / "trainable.safetensors"))


def metric_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_gradient_accumulation_equals_the_same_global_batch_over_more_ranks(ddp_case):
    """1 rank x batch 2 x accumulation 2 and 2 ranks x batch 2 train on the same micro-batches (the same sequences
    and anchors) with the same gradient, the mean of their objectives: DDP averages the two ranks' gradients in an
    all-reduce, accumulation adds the two backward passes of loss / 2 in one gradient buffer. With two micro-batches
    both add the same two exact halves, so the loss curve, the held-out curve and the weights agree bit for bit;
    with more, the sums' order may differ in the last bits (float noise). What differs: tokens/s and wall times."""
    root, cfg = ddp_case
    spawn_run(1, {**cfg, "output_dir": str(root / "accumulated"), "grad_accum": 2})
    drop = ("tokens_per_s", "time/")
    two, one = (
        [{k: v for k, v in r.items() if not k.startswith(drop)} for r in metric_rows(root / run)]
        for run in ("two_ranks", "accumulated")
    )
    assert [r["step"] for r in one] == [1, 2, 3, 4] and "eval/loss/total" in one[1]
    assert one == two
    assert one[0]["loss/total"] != one[2]["loss/total"]  # the curve moves: the comparison means something
    accumulated = final_weights(root / "accumulated")
    assert all(torch.equal(value, accumulated[name]) for name, value in final_weights(root / "two_ranks").items())


def test_resume_after_a_killed_rank_gives_the_uninterrupted_weights(ddp_case):
    """Rank 1 killed (SIGKILL) as step 3 starts, after the checkpoint of step 2; the run resumed on 2 ranks from
    that checkpoint ends with the uninterrupted run's weights and metrics, bit for bit. Before resuming, a save cut
    short (a temporary checkpoint folder) is planted: rank 0 alone removes it, and rank 1 writes nothing."""
    root, cfg = ddp_case
    run = root / "killed"
    with pytest.raises(Exception, match="signal|SIGKILL|exited"):
        spawn_run(2, {**cfg, "output_dir": str(run)}, kill_rank_at=(1, 3))
    assert (run / "latest").read_text().strip() == "step-00000002"
    orphan = run / "checkpoints" / ".step-00000003"
    orphan.mkdir()
    spawn_run(2, {**cfg, "output_dir": str(run)})
    assert not orphan.exists()
    uninterrupted = final_weights(root / "two_ranks")
    resumed = final_weights(run)
    assert uninterrupted.keys() == resumed.keys()
    assert all(torch.equal(resumed[name], value) for name, value in uninterrupted.items())
    drop = ("tokens_per_s", "time/")
    rows = [{k: v for k, v in r.items() if not k.startswith(drop)} for r in metric_rows(run)]
    assert rows == [{k: v for k, v in r.items() if not k.startswith(drop)} for r in metric_rows(root / "two_ranks")]


def test_rank_zero_writes_the_one_checkpoint(ddp_case):
    """The 2-rank run (its rank 1 failed on any write it made: `_run`) holds one checkpoint per save step, written by
    rank 0, and each step's metrics once."""
    root, _ = ddp_case
    run = root / "two_ranks"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]
    assert (run / "latest").read_text().strip() == "step-00000004"
    assert [r["step"] for r in metric_rows(run)] == [1, 2, 3, 4]
