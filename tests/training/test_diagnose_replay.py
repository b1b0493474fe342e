"""The training diagnosis on the recorded H200 session, and on a rearranged copy of it: the
phases are the oracle here and nowhere in the code."""

from __future__ import annotations

from training_traces import build_reordered_trace, checkpoint_windows, coverage, overlap, phase_windows

from gpulens.diagnose import diagnose
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store

TRAINING_KINDS = {"input_bound", "checkpoint_stall", "comm_bound", "straggler", "underutilized", "memory_pressure", "oom", "throttled", "nan_loss", "step_time_regression"}


def _check_against_phases(st: Store) -> list:
    findings = [f for f in diagnose(st) if f.workload == "training"]
    windows = phase_windows(st)
    by_kind = {k: [f for f in findings if f.kind == k] for k in TRAINING_KINDS}
    # Only the three problems that were staged, nothing else.
    assert {f.kind for f in findings} == {"input_bound", "checkpoint_stall", "underutilized"}
    for w in windows:
        if w.phase == "train_dataloader_stall":
            assert coverage(by_kind["input_bound"], w) >= 0.95, w
        if w.phase == "train_small_batch":
            assert coverage(by_kind["underutilized"], w) >= 0.9, w
        if w.phase == "train_normal":
            hits = [f for f in findings if overlap(f.start, f.end, w.start, w.end) > 0]
            assert hits == [], f"findings overlap a healthy stretch {w}: {[(h.kind, h.start, h.end) for h in hits]}"
    ckpts = checkpoint_windows(st)
    assert len(ckpts) == 2
    assert len(by_kind["checkpoint_stall"]) == len(ckpts)
    for a, b in ckpts:
        assert any(overlap(f.start, f.end, a, b) >= 0.9 * (b - a) for f in by_kind["checkpoint_stall"])
    for f in findings:
        assert f.evidence and f.advice and f.summary.endswith(".")
        assert f.labels["train_job"] == "h200-demo" and f.labels["rank"] == "0"
    return findings


def test_replayed_h200_session(replayed_store) -> None:
    with Store(replayed_store, readonly=True) as st:
        findings = _check_against_phases(st)
    ib = next(f for f in findings if f.kind == "input_bound")
    # The numbers a reader needs: ~78 % of each step waiting for data, ~4.5× the step's work.
    assert 0.7 <= ib.evidence["data_wait_share"] <= 0.85
    assert 4.0 <= ib.evidence["step_time_vs_busy_baseline"] <= 5.0
    assert ib.evidence["gpu_utilization_ratio"] < 0.35
    assert ib.advice[0].startswith("Give the data loader more worker")
    uu = next(f for f in findings if f.kind == "underutilized")
    assert uu.evidence["batch_size"] == 1 and uu.evidence["largest_batch_size_in_run"] == 8
    assert uu.evidence["tensor_active_ratio"] < 0.05


def test_reordered_phases_other_durations_and_times(tmp_path, h200_trace) -> None:
    trace = build_reordered_trace(h200_trace, tmp_path / "reordered")
    with Store(tmp_path / "r.db") as st:
        import_trace(trace, st)
        windows = phase_windows(st)
        assert [w.phase for w in windows] == ["train_normal", "train_small_batch", "train_small_batch", "train_dataloader_stall", "train_normal", "train_normal", "train_checkpoint", "train_normal"]
        _check_against_phases(st)


def test_job_filter(replayed_store) -> None:
    from gpulens.diagnose import DiagnoseScope

    with Store(replayed_store, readonly=True) as st:
        assert [f for f in diagnose(st, DiagnoseScope(job="other")) if f.workload == "training"] == []
        assert any(f.kind == "input_bound" for f in diagnose(st, DiagnoseScope(job="h200-demo")))


def test_colocation_recording_imports_sparse_steps(tmp_path, colocation_trace) -> None:
    with Store(tmp_path / "c.db") as st:
        import_trace(colocation_trace, st)
        steps = st.events("train_step")
        assert len(steps) > 100
        assert all(e.data["pid"] == steps[0].data["pid"] for e in steps)
        assert all(set(e.labels) == {"train_job", "rank", "host"} for e in steps)
        assert all("data_wait_s" not in e.data for e in steps)  # not measured is not zero
        findings = [f for f in diagnose(st) if f.workload == "training"]
        # No data wait or checkpoint was measured there: nothing may be claimed about them.
        assert not {f.kind for f in findings} & {"input_bound", "checkpoint_stall", "comm_bound"}
