"""Data-parallel training: the same `train` under two gloo processes (as torchrun sets them up)."""
import json
import os
import socket

import torch
import torch.multiprocessing as mp

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


def _worker(rank, world, port, cfg_kwargs, out):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                       "RANK": str(rank), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
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


def test_two_gloo_ranks_train_in_lockstep(tmp_path):
    from test_train import make_target, write_conversations

    target = make_target(tmp_path / "target")
    data = write_conversations(tmp_path / "train.jsonl", 10)
    cfg = dict(target=target, data=data, output_dir=str(tmp_path / "run"), eval_examples=2, block_size=4, candidate_topk=4,
               head_hidden_size=32, head_layers=1, head_heads=4, factor_dim=16, bf16=False, max_steps=2, batch_size=1,
               num_anchors=4, log_every=1, save_every=2, max_length=48)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["step"] == r1["step"] == 2
    assert r0["fc_0"] == r1["fc_0"] and r0["fc_sum"] == r1["fc_sum"]  # gradients were all-reduced
    assert (tmp_path / "run" / "checkpoints" / "step-00000002" / "trainable.safetensors").is_file()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2  # rank 0 logs only
