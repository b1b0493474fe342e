"""A training job in its own process, instrumented with the real TrainingMonitor: step times drawn
from a seeded distribution (some slow steps), a data loader that waits a little per batch."""

import random
import sys
import time

from gpulens import TrainingMonitor

store, steps = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
# a model's FLOPs per token and the GPU's peak, so each step carries an MFU (no CUDA here to look one up)
mon = TrainingMonitor(job="llama-ft", store=store, flush_interval_seconds=0.5, flops_per_token=6 * 1.1e8, peak_flops=989e12)


def loader():
    for i in range(steps):
        time.sleep(rng.uniform(0.001, 0.004))
        yield i


for _batch in mon.data(loader()):
    with mon.step(samples=8, tokens=8 * 512):
        time.sleep(rng.choice((0.012, 0.02, 0.03, 0.045)) if rng.random() > 0.08 else 0.16)
mon.close()
