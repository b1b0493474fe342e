"""Runs in a real SQLite store: saving, reading back, automatic change records, notes, verdicts."""

from __future__ import annotations

import pytest

from gpulens.errors import BadInputError
from gpulens.runs import (
    add_note,
    baseline_for,
    get_run,
    last_known_good,
    list_runs,
    resolve_run,
    run_changes,
    save_run,
    set_baseline,
    set_verdict,
)
from gpulens.store import Store

FP = {"host": "a", "driver": "580.1", "gpus": [{"index": 0, "name": "NVIDIA H200", "vbios": "96.00"}], "packages": {"torch": "2.4"}}


def test_save_and_read_back_after_reopening(store_path):
    with Store(store_path) as st:
        rid = save_run(st, "bench-train", "small", {"batch": 8}, {"tokens_per_second": 1000.0},
                       {"step_seconds": [0.1, 0.11, float("nan"), 0.12]}, fingerprint=FP, started=10.0, ended=20.0)
    with Store(store_path) as st:  # a new connection: the run was committed, not just buffered
        run = get_run(st, rid)
    assert (run.kind, run.name, run.config, run.started, run.ended) == ("bench-train", "small", {"batch": 8}, 10.0, 20.0)
    assert run.samples == {"step_seconds": [0.1, 0.11, 0.12]}  # NaN is no sample
    assert run.fingerprint == FP and run.verdict is None


def test_fingerprint_is_taken_when_not_given(store):
    run = get_run(store, save_run(store, "bench-train", "x", {}, {}))
    assert run.fingerprint["python"] and "packages" in run.fingerprint and "gpus" in run.fingerprint


def test_changes_between_consecutive_runs_are_recorded(store):
    a = save_run(store, "train", "llama", {"micro_batch": 8, "lr": 1e-4}, {}, fingerprint=FP)
    other = save_run(store, "train", "other-job", {"micro_batch": 1}, {}, fingerprint=FP)
    fp2 = {**FP, "host": "b", "driver": "580.2"}
    b = save_run(store, "train", "llama", {"micro_batch": 16, "lr": 1e-4, "ckpt": True}, {}, fingerprint=fp2)
    assert run_changes(store, a) == [] and run_changes(store, other) == []
    ch = {(c.section, c.change.key): (c.change.old, c.change.new) for c in run_changes(store, b)}
    # compared with the previous *llama* run, not the other job; the host name is not a change
    assert ch == {("config", "micro_batch"): (8, 16), ("config", "ckpt"): (None, True), ("fingerprint", "driver"): ("580.1", "580.2")}
    assert all(c.previous_run_id == a for c in run_changes(store, b))
    ev = store.events("run_change")
    assert len(ev) == 1 and ev[0].data["run_id"] == b and len(ev[0].data["changes"]) == 3


def test_note_on_the_timeline(store):
    t = add_note(store, "  raised micro-batch to 16 ", t=123.0, labels={"train_job": "llama"})
    (ev,) = store.events("note")
    assert (t, ev.t, ev.data["text"], ev.labels) == (123.0, 123.0, "raised micro-batch to 16", {"train_job": "llama"})
    with pytest.raises(BadInputError, match="needs some text"):
        add_note(store, "   ")


def test_missing_run_is_said_plainly(store):
    with pytest.raises(BadInputError, match="no runs yet"):
        get_run(store, 3)
    save_run(store, "k", "n", {}, {}, fingerprint={})
    with pytest.raises(BadInputError, match=r"no run #7; the store holds 1 runs"):
        get_run(store, 7)
    with pytest.raises(BadInputError, match="is not a run"):
        resolve_run(store, "seven")


def test_bad_samples_are_refused(store):
    with pytest.raises(BadInputError, match="must be numbers"):
        save_run(store, "k", "n", {}, {}, {"step_seconds": [0.1, "slow"]}, fingerprint={})
    assert list_runs(store) == []  # nothing half-written


def test_list_filters_and_orders_newest_first(store):
    ids = [save_run(store, k, n, {}, {}, fingerprint={}) for k, n in (("a", "x"), ("b", "x"), ("a", "y"), ("a", "x"))]
    assert [r.id for r in list_runs(store)] == ids[::-1]
    assert [r.id for r in list_runs(store, "a", "x")] == [ids[3], ids[0]]
    assert [r.id for r in list_runs(store, limit=2)] == [ids[3], ids[2]]


def test_baseline_and_last_known_good(store):
    r1, r2, r3, r4 = (save_run(store, "bench-train", "s", {"i": i}, {}, fingerprint={}) for i in range(4))
    assert baseline_for(store, get_run(store, r4)).id == r1  # nothing marked: the oldest
    set_verdict(store, r2, "good")
    set_verdict(store, r3, "regression")
    assert last_known_good(store, "bench-train", "s").id == r2
    assert baseline_for(store, get_run(store, r4)).id == r2
    set_baseline(store, r3)
    set_baseline(store, r1)  # only one baseline per kind and name
    assert [r.id for r in list_runs(store) if r.baseline] == [r1]
    assert resolve_run(store, "baseline", other=get_run(store, r4)).id == r1
    assert resolve_run(store, "latest").id == r4
    with pytest.raises(BadInputError, match="first run"):
        baseline_for(store, get_run(store, save_run(store, "bench-train", "new", {}, {}, fingerprint={})))


def test_two_processes_saving_at_once_keep_a_consistent_change_chain(store_path):
    """Each run's recorded changes are against the run saved just before it, even when two
    processes write to the same store file at the same time."""
    import subprocess
    import sys

    code = (
        "import sys; from gpulens.store import Store; from gpulens.runs import save_run\n"
        "with Store(sys.argv[1]) as st:\n"
        "    for i in range(15): save_run(st, 'loadtest', 'api', {'writer': sys.argv[2], 'i': i}, {}, fingerprint={})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(store_path), w]) for w in ("a", "b")]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    with Store(store_path) as st:
        ids = sorted(r.id for r in list_runs(st))
        assert len(ids) == 30
        for prev, cur in zip(ids, ids[1:], strict=False):
            chain = {c.previous_run_id for c in run_changes(st, cur)}
            assert chain == {prev}, (cur, chain)


def test_the_automatic_baseline_does_the_same_work_in_a_step(store):
    """A comparison that found the batch-8 run good does not make it the baseline of batch-16 runs."""
    b16, b8 = (save_run(store, "bench-train", "s", {"batch_size": n, "workers": 2}, {}, fingerprint={}) for n in (16, 8))
    set_verdict(store, b8, "good")
    again16 = save_run(store, "bench-train", "s", {"batch_size": 16, "workers": 4}, {}, fingerprint={})
    assert baseline_for(store, get_run(store, again16)).id == b16  # the same work, not the newest good
    again8 = save_run(store, "bench-train", "s", {"batch_size": 8}, {}, fingerprint={})
    assert baseline_for(store, get_run(store, again8)).id == b8
    other = save_run(store, "bench-train", "s", {"batch_size": 32}, {}, fingerprint={})
    assert baseline_for(store, get_run(store, other)).id == b8  # none does its work: the known-good of any
    set_baseline(store, b16)
    assert baseline_for(store, get_run(store, other)).id == b16  # a baseline the user marked wins
