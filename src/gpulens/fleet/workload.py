"""The rig's workloads, each a process of its own (`python -m gpulens.fleet.workload job|serve SPEC`):

- `job`: a multi-node training job. One process writes every rank's records the way a
  TrainingMonitor's writer does (`train_start`, then `write_step` per step, a commit per round):
  cheap enough for 32 ranks on a 2-core machine. Rank r runs on node r // per_node, CUDA device
  r % per_node; the straggler rank's compute takes SLOW_FACTOR times the others', who wait for it in
  the all-reduce.
- `serve`: one inference service on some nodes, through a real InferenceMonitor per node: a request
  ends every REQUEST_EVERY_SECONDS on each node, each REQUEST_LATENCY_SECONDS long, and the engine's
  KV-cache usage is KV_CACHE_USAGE_RATIO. So each node carries REQUEST_LATENCY / REQUEST_EVERY
  requests in flight (Little's law) and the service's totals are known exactly.

Each prints how many records it wrote (steps, requests) when it ends, so the rig can wait for
Prometheus to hold them all.
"""

from __future__ import annotations

import json
import signal
import sys
import time

JOB = "pretrain"
STEP_DATA_S, STEP_COMPUTE_S, SLOW_FACTOR, ALLREDUCE_S = 0.01, 0.30, 1.6, 0.02
SERVICE = "chat"
REQUEST_EVERY_SECONDS, REQUEST_LATENCY_SECONDS, KV_CACHE_USAGE_RATIO = 0.1, 2.0, 0.9


def _stop_on_term() -> list[bool]:
    """SIGTERM / SIGINT end the loop at its next round (the records written so far are committed)."""
    stop = [False]

    def handler(signum: int, frame: object) -> None:
        stop[0] = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop


def run_job(spec: dict) -> int:
    """Every rank's records, in real time, for spec["seconds"]. Returns the steps written."""
    from gpulens.store import Store
    from gpulens.vocab import names as N
    from gpulens.workload.training.records import StepRecord, write_step

    stop = _stop_on_term()
    stores = [Store(p) for p in spec["stores"]]
    ranks, per_node = spec["ranks"], max(1, spec["ranks"] // len(stores))
    slowest = STEP_COMPUTE_S * SLOW_FACTOR
    period = STEP_DATA_S + slowest + ALLREDUCE_S
    t0 = time.time()
    labels, ids = [], []
    for r in range(ranks):
        node = min(r // per_node, len(stores) - 1)
        lab = {N.TRAIN_JOB_LABEL: JOB, "rank": str(r), "host": spec["hosts"][node]}
        labels.append((node, lab))
        ids.append({})
        stores[node].event(N.EV_TRAIN_START, t0, lab, {"pid": 20000 + r, "rank": r, "world_size": ranks, "gpu": r % per_node})
    written, step = 0, 0
    while not stop[0] and (t_end := t0 + (step + 1) * period) <= t0 + spec["seconds"]:
        time.sleep(max(0.0, t_end - time.time()))
        for r, (node, lab) in enumerate(labels):
            compute = slowest if r == spec["straggler"] else STEP_COMPUTE_S
            rec = StepRecord(t_start=t_end - period, t_end=t_end, step=step, step_s=period, data_wait_s=STEP_DATA_S, compute_s=compute,
                             comm_wait_s=period - STEP_DATA_S - compute, checkpoint_s=0.0, samples=8, tokens=16384,
                             loss=2.5 - 0.001 * step, pid=20000 + r, rank=r)
            write_step(stores[node], lab, rec, ids[r])
            written += 1
        for st in stores:
            st.flush()
        step += 1
    for st in stores:
        st.close()
    return written


def run_service(spec: dict) -> int:
    """Requests of SERVICE on each of spec["stores"] for spec["seconds"]. Returns the requests written."""
    from gpulens.workload.inference.monitor import InferenceMonitor

    stop = _stop_on_term()
    monitors = [InferenceMonitor(path, service=SERVICE, model="fleet-llm", host=host, flush_interval_seconds=None)
                for path, host in zip(spec["stores"], spec["hosts"], strict=True)]
    t0, written, i = time.time(), 0, 0
    while not stop[0] and (t_end := t0 + (i + 1) * REQUEST_EVERY_SECONDS) <= t0 + spec["seconds"]:
        time.sleep(max(0.0, t_end - time.time()))
        for mon in monitors:
            req = mon.start_request(arrival=time.time() - REQUEST_LATENCY_SECONDS)
            req.finish("ok", output_tokens=64, prompt_tokens=256)
            written += 1
            if i % round(1 / REQUEST_EVERY_SECONDS) == 0:  # the engine's KV-cache usage, once a second
                mon.set_memory(kv_cache_usage_ratio=KV_CACHE_USAGE_RATIO)
            mon.flush()
        i += 1
    for mon in monitors:
        mon.close()
    return written


def main(argv: list[str]) -> int:
    kind, spec = argv[0], json.loads(argv[1])
    print(run_job(spec) if kind == "job" else run_service(spec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
