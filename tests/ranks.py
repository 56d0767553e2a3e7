"""start_ranks: `nprocs` CPU processes running fn(rank, *args), as torchrun would start gloo ranks, forked from the test
process: a rank starts with torch and the package already imported (a spawned one imports them again, several seconds
a rank on a loaded 2-core machine). CPU ranks only: a process that has used CUDA cannot fork one that uses it."""

import torch.multiprocessing as mp


def start_ranks(fn, args: tuple, nprocs: int) -> None:
    """Runs the ranks and waits for them; a rank that fails or dies raises here (torch's ProcessRaisedException or
    ProcessExitedException), and the others are ended."""
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="fork")
