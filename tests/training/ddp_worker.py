"""One rank of the 2-process gloo test (a module of its own so that spawned processes import it)."""

from __future__ import annotations

import os
import time


def run_rank(rank: int, world: int, store_path: str, port: int, slow_rank: int, slow_s: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpulens.workload.training import TrainingMonitor, ddp_comm_hook, timed_collectives

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # rank and world size come from the initialized process group
    mon = TrainingMonitor(job="ddp", store=store_path, flush_interval_seconds=0.2, host="node")
    model.register_comm_hook(*ddp_comm_hook(mon))
    x = torch.randn(8, 16)
    for _ in range(12):  # DDP: the hook times the gradient all-reduce
        with mon.step(samples=8) as s:
            loss = model(x).square().mean()
            if rank == slow_rank:
                time.sleep(slow_s)  # a slow rank: everyone else waits in the all-reduce
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.loss = loss
    t = torch.ones(4)
    with timed_collectives(mon):  # plain collectives, timed by the wrapper
        for _ in range(12):
            with mon.step(samples=8):
                if rank == slow_rank:
                    time.sleep(slow_s)
                dist.all_reduce(t)
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
