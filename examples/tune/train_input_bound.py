"""A tiny CPU training script whose data loader is input-bound: every sample waits on "I/O".

It is the example `gpulens tune train` walks through in docs/tune.md: with no worker processes
the loop spends most of each step waiting for data; more workers fix that; a smaller batch makes
each step's fixed overhead count for more and is slower. It times its loop with gpulens's
TrainingMonitor, created without a store, so `gpulens tune` can point it at its own.

    python examples/tune/train_input_bound.py --batch-size 16 --num-workers 0 --steps 20

`--memory-limit-samples` plays a GPU's memory: a batch larger than that raises the same
out-of-memory error CUDA would, so a tune can be shown to survive an OOM on a CPU.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch.utils.data import DataLoader, Dataset

from gpulens import TrainingMonitor

SEQ_LEN = 32
FEATURES = 16


class SlowDataset(Dataset):
    """Samples that each take `io_ms` to read, as from a slow disk or a remote bucket."""

    def __init__(self, n: int, io_ms: float):
        self.n, self.io_s = n, io_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.io_s)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(SEQ_LEN, FEATURES, generator=g)
        return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--io-ms", type=float, default=4.0, help="read time per sample")
    p.add_argument("--step-overhead-ms", type=float, default=10.0, help="fixed cost per step (launches, optimizer)")
    p.add_argument("--memory-limit-samples", type=int, default=1 << 30, help="a batch above this runs out of 'GPU' memory")
    p.add_argument("--nan-after", type=int, default=-1, help="make the loss NaN from this step on (a diverging run)")
    p.add_argument("--job", default="input-bound-example")
    a = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = SlowDataset(a.batch_size * (a.steps + 2), a.io_ms)
    loader = DataLoader(data, batch_size=a.batch_size, num_workers=a.num_workers, persistent_workers=a.num_workers > 0)
    mon = TrainingMonitor(job=a.job, config=vars(a))
    step = 0
    for x, y in mon.data(loader):
        if step >= a.steps:
            break
        with mon.step(samples=len(x), tokens=len(x) * SEQ_LEN) as s:
            if len(x) > a.memory_limit_samples:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {len(x) * 64} MiB (this example's limit is "
                    f"{a.memory_limit_samples} samples per batch)")
            loss = torch.nn.functional.mse_loss(model(x), y)
            if 0 <= a.nan_after <= step:
                loss = loss * math.nan
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(a.step_overhead_ms / 1000)
            s.loss = loss.item()
        step += 1
    mon.close()


if __name__ == "__main__":
    main()
