"""The right workload blamed (issue 23 item 4): GPU events join the workloads that were on that
GPU at that moment. Every case is a small recording written here (gpulens's recording format plus
an events.jsonl), imported with the real replay and diagnosed; each rule is tested with its cause
present and absent."""

from __future__ import annotations

import json
from pathlib import Path

from gpulens.cli.main import main
from gpulens.diagnose import diagnose
from gpulens.diagnose.gpu_workloads import GpuRef, MemoryHolder, gpu_of, largest_other_holder, occupants, runs
from gpulens.pipeline.ingest import import_trace
from gpulens.reader import analysis_reader
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_UP
from gpulens.workload.importers import ImportContext

T0 = 1_800_000_000.0
TOTAL = 80_000_000_000
STEP_S = 0.5


class Recording:
    """A recording of `gpus` GPUs sampled once a second, and its workload records."""

    def __init__(self, gpus: int, seconds: int, host: str | None = None):
        self.gpus, self.seconds, self.host = gpus, seconds, host
        self.procs: dict[tuple[int, int], list[dict]] = {}  # (gpu, second) -> processes listed
        self.mask: dict[tuple[int, int], int] = {}
        self.silent: dict[int, int] = {}  # gpu -> first second with no sample
        self.xids: list[dict] = []
        self.events: list[dict] = []

    def process(self, gpu: int, pid: int, a: int, b: int, used: int = 20_000_000_000, name: str = "python") -> None:
        for t in range(a, b + 1):
            self.procs.setdefault((gpu, t), []).append({"pid": pid, "name": name, "used_memory_bytes": used})

    def job(self, job: str, rank: int, pid: int, gpu: int, a: float, b: float, *, cuda: int | None = None, **fields) -> None:
        """A rank stepping every STEP_S seconds over [a, b], listed on `gpu`; its train_start says `cuda`."""
        self.process(gpu, pid, int(a), int(b))
        self.events.append({"kind": "train_start", "t": T0 + a, "job": job, "rank": rank, "pid": pid, "gpu": gpu if cuda is None else cuda, **fields})
        t, i = a, 0
        while t + STEP_S <= b:
            self.events.append({"kind": "train_step", "job": job, "rank": rank, "pid": pid, "step": i, "t_start": T0 + t, "t_end": T0 + t + STEP_S,
                                "step_s": STEP_S, "data_wait_s": 0.001, "comm_wait_s": 0.0, "checkpoint_s": 0.0, "batch": 8, "mem_peak": 18e9, **fields})
            t, i = t + STEP_S, i + 1

    def service(self, service: str, pid: int, gpu: int, a: float, b: float, fail_from: float | None = None) -> None:
        self.process(gpu, pid, int(a), int(b))
        t = a
        while t < b:
            bad = fail_from is not None and t >= fail_from
            self.events.append({"kind": "request", "arrival": T0 + t, "start": T0 + t, "end": T0 + t + (0.01 if bad else 0.2),
                                "status": "error" if bad else "ok", "prompt_tokens": 100, "output_tokens": 20, "pid": pid, "service": service})
            t += 0.25

    def xid(self, gpu: int, t: float, code: int, *, silent_after: bool = False) -> None:
        self.xids.append({"type": "xid", "t": T0 + t, "gpu": gpu, "uuid": f"GPU-{gpu}", "xid": code})
        if silent_after:
            self.silent[gpu] = int(t) + 1

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        head = {"format": "gpulens-recording", "version": 1, "gpus": [{"index": g, "uuid": f"GPU-{g}", "name": "NVIDIA H100", "memory_total_bytes": TOTAL} for g in range(self.gpus)]}
        if self.host:
            head["host"] = self.host
        lines = [head]
        for t in range(self.seconds):
            for g in range(self.gpus):
                if t >= self.silent.get(g, 10**9):
                    continue
                procs = self.procs.get((g, t), [])
                lines.append({"type": "sample", "t": T0 + t, "gpu": g, "uuid": f"GPU-{g}", "utilization_gpu_ratio": 0.9 if procs else 0.0,
                              "memory_used_bytes": 1e9 + sum(p["used_memory_bytes"] for p in procs), "memory_total_bytes": TOTAL,
                              "sm_clock_hz": 0.9e9 if self.mask.get((g, t)) else 1.9e9, "temperature_celsius": 60.0,
                              "clock_event_mask": self.mask.get((g, t), 0), "processes": procs})
            lines += [x for x in self.xids if int(x["t"] - T0) == t]
        (folder / "recording.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        (folder / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self.events))
        return folder


def replayed(rec: Recording, tmp_path: Path, **ctx) -> Store:
    st = Store(tmp_path / "s.db")
    import_trace(rec.write(tmp_path / "trace"), st, ctx=ImportContext(**ctx))
    return st


def hosts_of_gpus(st: Store) -> set[str]:
    return {k["host"] for k in analysis_reader(st).series_labels(GPU_UP)}


def one(findings, kind: str, gpu: str):
    got = [f for f in findings if f.kind == kind and f.labels.get("gpu") == gpu]
    assert len(got) == 1, [(f.kind, f.labels) for f in findings]
    return got[0]


def hit(f) -> list[str]:
    return [i["workload"] for i in f.evidence["workload_impact"]]


# ------------------------------------------------------------------ presence: no slack past a job's end
def test_an_xid_on_an_idle_gpu_between_two_jobs_hits_neither(tmp_path):
    rec = Recording(1, 70)
    rec.job("job-a", 0, 100, 0, 1, 25)
    rec.job("job-b", 0, 101, 0, 50, 68)
    rec.xid(0, 37.0, 94)
    st = replayed(rec, tmp_path)
    xid = one(diagnose(st), "gpu_xid", "0")
    assert hit(xid) == [] and N.TRAIN_JOB_LABEL not in xid.labels
    assert "No workload gpulens knows of ran on it" in xid.summary


def test_an_xid_just_after_a_jobs_last_step_hits_it(tmp_path):
    """The cause present: an XID within one step of the job's last one (the job it killed)."""
    rec = Recording(1, 70)
    rec.job("job-a", 0, 100, 0, 1, 25)
    rec.job("job-b", 0, 101, 0, 50, 68)
    rec.xid(0, 25.3, 94)
    xid = one(diagnose(replayed(rec, tmp_path)), "gpu_xid", "0")
    assert hit(xid) == ["job job-a rank 0"]


def test_presence_is_runs_of_records_widened_by_one_own_interval():
    assert runs([(0, 1), (1, 2), (2, 3), (20, 21)], 5.0, 1.0) == [(-1, 4), (19, 22)]
    assert runs([(0, 1), (3, 4)], 5.0, 0.5) == [(-0.5, 4.5)]


def test_a_hung_job_stays_present_while_its_process_is_listed(tmp_path):
    """Records stop, the process stays on the GPU: an XID then still hits the job."""
    rec = Recording(1, 60)
    rec.job("hung", 0, 100, 0, 1, 20)
    rec.process(0, 100, 21, 59)
    rec.xid(0, 45.0, 43)
    xid = one(diagnose(replayed(rec, tmp_path)), "gpu_xid", "0")
    assert hit(xid) == ["job hung rank 0"]


# ------------------------------------------------------------------ ranks on many GPUs
def _eight_ranks(rec: Recording, *, listed: bool = True) -> None:
    for r in range(4):
        rec.job("pre", r, 300 + r, r, 1, 58, cuda=0)  # every rank says cuda:0 (CUDA_VISIBLE_DEVICES)
    if not listed:
        rec.procs.clear()


def test_an_xid_during_a_job_hits_exactly_the_ranks_on_that_gpu(tmp_path):
    rec = Recording(4, 60)
    _eight_ranks(rec)
    rec.xid(2, 30.2, 48)
    xid = one(diagnose(replayed(rec, tmp_path)), "gpu_xid", "2")
    assert hit(xid) == ["job pre rank 2"] and xid.labels["rank"] == "2"


def test_rank_to_gpu_through_the_process_list_when_every_rank_reports_cuda0(tmp_path):
    rec = Recording(4, 60)
    _eight_ranks(rec)
    for t in range(10, 40):
        rec.mask[(2, t)] = 0x40  # hw thermal slowdown on GPU 2 only
    st = replayed(rec, tmp_path)
    placed = occupants(st)
    assert gpu_of(placed, {N.TRAIN_JOB_LABEL: "pre", "rank": "2", "host": "replay"}, T0, T0 + 60) == GpuRef("replay", "2")
    throttled = [f for f in diagnose(st) if f.kind == "throttled"]
    assert [f.labels["rank"] for f in throttled] == ["2"]


def test_without_a_process_list_a_shared_cuda_index_places_no_rank(tmp_path):
    """The cause absent: cuda:0 from every rank is ambiguous, so no rank looks at GPU 0 (or at all GPUs merged)."""
    rec = Recording(4, 60)
    _eight_ranks(rec, listed=False)
    for t in range(10, 40):
        rec.mask[(0, t)] = 0x40
    st = replayed(rec, tmp_path)
    assert not any(o.labels.get(N.TRAIN_JOB_LABEL) == "pre" for occs in occupants(st).values() for o in occs)
    assert not [f for f in diagnose(st) if f.kind == "throttled"]


def test_an_unambiguous_cuda_index_places_a_rank_without_a_process_list(tmp_path):
    rec = Recording(4, 60)
    for r in range(2):
        rec.job("ddp", r, 400 + r, r, 1, 58)  # cuda:r, each index claimed once
    rec.procs.clear()
    placed = occupants(replayed(rec, tmp_path))
    assert [o.name for o in placed[GpuRef("replay", "1")]] == ["job ddp rank 1"]
    assert placed[GpuRef("replay", "1")][0].identified_by == "its train_start event"


# ------------------------------------------------------------------ services and hosts through replay
def test_two_services_on_two_gpus_keep_apart_through_replay(tmp_path):
    rec = Recording(2, 60)
    rec.service("chat", 200, 0, 1, 58)
    rec.service("embed", 201, 1, 1, 50, fail_from=30.5)
    rec.xid(1, 30.2, 79, silent_after=True)
    st = replayed(rec, tmp_path)
    assert {e.labels["service"] for e in st.events(N.EV_REQUEST)} == {"chat", "embed"}
    xid = one(diagnose(st), "gpu_xid", "1")
    assert hit(xid) == ["service embed"] and xid.labels["service"] == "embed"
    imp = xid.evidence["workload_impact"][0]
    embed_after = [e for e in rec.events if e.get("service") == "embed" and e["end"] >= T0 + 30.2]
    assert imp["requests_after_start"] == len(embed_after)  # chat's requests are not counted with embed's
    assert imp["failed_requests_after_start"] == sum(e["status"] != "ok" for e in embed_after) > 0


def test_a_request_without_a_service_takes_the_imports(tmp_path):
    rec = Recording(1, 20)
    rec.service("chat", 200, 0, 1, 18)
    for e in rec.events:
        del e["service"]
    st = replayed(rec, tmp_path, service="fallback")
    assert {e.labels["service"] for e in st.events(N.EV_REQUEST)} == {"fallback"}


def _thermal_on_node(rec: Recording, host: str | None) -> None:
    rec.job("ft", 0, 700, 0, 1, 58, host="node-a")
    for t in range(20, 50):
        rec.mask[(0, t)] = 0x40


def test_a_recording_whose_header_and_events_name_a_host_joins(tmp_path):
    rec = Recording(1, 60, host="node-a")
    _thermal_on_node(rec, "node-a")
    st = replayed(rec, tmp_path)
    cut = one(diagnose(st), "gpu_clock_cut", "0")
    assert cut.labels["host"] == "node-a" and cut.labels[N.TRAIN_JOB_LABEL] == "ft"
    assert hosts_of_gpus(st) == {"node-a"}


def test_events_naming_a_host_join_the_samples_of_a_recording_without_one(tmp_path):
    rec = Recording(1, 60)
    _thermal_on_node(rec, None)
    cut = one(diagnose(replayed(rec, tmp_path)), "gpu_clock_cut", "0")
    assert cut.labels["host"] == "node-a" and hit(cut) == ["job ft rank 0"]


def test_replay_host_option_puts_samples_and_events_under_one_host(tmp_path, capsys):
    rec = Recording(1, 60, host="node-a")
    _thermal_on_node(rec, "node-a")
    trace = rec.write(tmp_path / "trace")
    db = tmp_path / "h.db"
    assert main(["replay", str(trace), "--store", str(db), "--host", "node-b"]) in (0, None)
    with Store(db) as st:
        assert hosts_of_gpus(st) == {"node-b"}
        assert {e.labels["host"] for e in st.events(N.EV_TRAIN_STEP)} == {"node-b"}
        cut = one(diagnose(st), "gpu_clock_cut", "0")
        assert hit(cut) == ["job ft rank 0"]


def test_events_of_another_host_keep_it():
    ctx = ImportContext(host="node-b", host_map={"node-a": "node-b"})
    assert ctx.host_of({"host": "node-a"}) == "node-b"
    assert ctx.host_of({"host": "node-c"}) == "node-c"
    assert ctx.host_of({}) == "node-b"
    assert ImportContext().host_of({}) == "replay"


# ------------------------------------------------------------------ memory held by another process
def test_the_other_process_memory_finding_names_the_pid(tmp_path):
    rec = Recording(1, 40)
    rec.job("ft", 0, 500, 0, 1, 38)
    rec.process(0, 4242, 0, 39, used=55_000_000_000, name="stale")  # 69 % of the GPU, not the job's pid
    found = diagnose(replayed(rec, tmp_path))
    f = one(found, "other_process_memory", "0")
    assert "pid 4242" in f.summary and f.evidence["pid"] == 4242 and f.evidence["process"] == "stale"
    assert f.evidence["memory_bytes"] == 55e9 and f.evidence["workload_allocator_peak_bytes"] == 18e9
    assert f.labels[N.TRAIN_JOB_LABEL] == "ft" and any("4242" in a for a in f.advice)
    mp = [x for x in found if x.kind == "memory_pressure"]
    assert mp and all("the job used" not in x.summary and "pid 4242" in x.summary for x in mp)
    assert not any("gradient accumulation" in a for x in mp for a in x.advice)


def test_no_other_process_finding_when_the_big_process_is_the_job(tmp_path):
    """The cause absent: the job's own pid holds the memory; the pressure is the job's."""
    rec = Recording(1, 40)
    rec.job("ft", 0, 500, 0, 1, 38)
    rec.process(0, 500, 0, 39, used=55_000_000_000)
    found = diagnose(replayed(rec, tmp_path))
    assert not [f for f in found if f.kind == "other_process_memory"]
    assert all("pid" not in f.summary for f in found if f.kind == "memory_pressure")


def test_no_other_process_finding_while_no_workload_runs_there(tmp_path):
    rec = Recording(2, 40)
    rec.job("ft", 0, 500, 0, 1, 38)
    rec.process(1, 4242, 0, 39, used=55_000_000_000)  # on the other GPU, where nothing of ours runs
    assert not [f for f in diagnose(replayed(rec, tmp_path)) if f.kind == "other_process_memory"]


def test_the_largest_other_holder_needs_the_workloads_own_pid():
    """Without the job's own pid the listing cannot tell its process from another: nothing is named."""
    series = {(4242, "stale"): ([1.0, 2.0], [50e9, 55e9]), (500, "python"): ([1.0, 2.0], [20e9, 20e9])}
    assert largest_other_holder(series, {500}, 0.0, 3.0, 10e9) == MemoryHolder(4242, "stale", 55e9)
    assert largest_other_holder(series, {None}, 0.0, 3.0, 10e9) is None
    assert largest_other_holder(series, {500}, 0.0, 3.0, 60e9) is None  # not a large share
