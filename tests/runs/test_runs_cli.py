"""`gpulens runs`, `note`, `compare` and `env` as a user meets them: real store files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gpulens.cli.main import main
from gpulens.runs import get_run, save_run
from gpulens.store import Store


@pytest.fixture
def two_runs(store_path, step_times):
    """Run 1 (reference) and run 2, 10 % slower, with a config change that leaves a step's work alone."""
    rng = np.random.default_rng(5)
    with Store(store_path) as st:
        a = save_run(st, "bench-train", "small", {"workers": 4}, {"step_seconds_median": 0.2}, {"step_seconds": step_times(rng, 0.2)}, fingerprint={"driver": "1"})
        b = save_run(st, "bench-train", "small", {"workers": 8}, {"step_seconds_median": 0.22}, {"step_seconds": step_times(rng, 0.22)}, fingerprint={"driver": "1"})
    return store_path, a, b


def test_compare_exits_1_on_regression_and_shows_rollback(two_runs, capsys):
    db, a, b = two_runs
    assert main(["compare", str(a), str(b), "--store", str(db)]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "regression" in out and "not comparable" not in out and "workers: 4 → 8" in out
    assert f"last known-good: #{a}" in out
    err = " ".join(captured.err.split())  # the gate error's sentence, on stderr only
    assert err.startswith(f"error: Run #{b} ") and f"regressed against #{a} " in err


def test_compare_json_and_threshold(two_runs, capsys):
    db, a, b = two_runs
    assert main(["compare", str(a), str(b), "--store", str(db), "--format", "json", "--threshold", "50%", "--no-record"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "no change" and d["threshold_ratio"] == 0.5 and d["metrics"][0]["p_value"] < 0.05
    with Store(db) as st:
        assert get_run(st, b).verdict is None  # --no-record


def test_compare_against_the_baseline(two_runs, capsys):
    db, a, b = two_runs
    assert main(["runs", "baseline", str(a), "--store", str(db)]) == 0
    assert main(["compare", "latest", "--store", str(db), "--format", "json"]) == 1
    d = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert (d["a"]["id"], d["b"]["id"]) == (a, b)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["compare", "1", "99"], "no run #99"),
        (["compare", "1", "3"], "only runs of the same kind"),
        (["compare", "1", "2", "--threshold", "five"], "not a number"),
        (["compare", "1", "2", "--format", "xml"], "unknown --format"),
        (["compare", "1", "1"], "compared with itself"),
        (["runs", "show", "x"], "is not a run"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(two_runs, capsys, args, needle):
    db, _a, _b = two_runs
    with Store(db) as st:
        save_run(st, "loadtest", "small", {}, {}, fingerprint={})
    assert main([*args, "--store", str(db)]) == 2
    err = " ".join(capsys.readouterr().err.lower().split())  # rich wraps at the console width
    assert needle.lower() in err and "traceback" not in err


def test_compare_in_a_store_that_does_not_exist(tmp_path, capsys):
    assert main(["compare", "1", "2", "--store", str(tmp_path / "none.db")]) == 2
    assert "no store" in " ".join(capsys.readouterr().err.lower().split())
    assert not (tmp_path / "none.db").exists()


def test_note_and_runs_list(two_runs, capsys):
    db, a, b = two_runs
    assert main(["note", "raised micro-batch to 16", "--job", "llama", "--store", str(db)]) == 0
    assert main(["runs", "list", "--store", str(db), "--format", "json"]) == 0
    out = capsys.readouterr().out
    runs = json.loads(out[out.index("["):])
    assert [r["id"] for r in runs] == [b, a]
    with Store(db) as st:
        (ev,) = st.events("note")
    assert ev.data["text"] == "raised micro-batch to 16" and ev.labels == {"train_job": "llama"}
    assert main(["runs", "show", str(b), "--store", str(db)]) == 0
    assert f"changed since run #{a}" in capsys.readouterr().out


def test_a_filter_that_matches_nothing_is_not_an_empty_store(two_runs, capsys):
    db, _a, _b = two_runs
    assert main(["runs", "list", "--store", str(db), "--kind", "garbage"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "No runs of kind 'garbage'; the store holds runs of kind bench-train." in out and "yet" not in out


def test_env_json_and_diff(tmp_path, capsys):
    assert main(["env", "--format", "json"]) == 0
    fp = json.loads(capsys.readouterr().out)
    assert fp["python"] and isinstance(fp["packages"], dict)
    before = tmp_path / "before.json"
    before.write_text(json.dumps(fp))
    fp2 = {**fp, "driver": "999.1", "env": {**fp["env"], "NCCL_P2P_DISABLE": "1"}}
    after = tmp_path / "after.json"
    after.write_text(json.dumps(fp2))
    assert main(["env", "diff", str(before), str(after), "--format", "json"]) == 0
    got = {c["key"]: c["new"] for c in json.loads(capsys.readouterr().out)}
    assert got == {"driver": "999.1", "env.NCCL_P2P_DISABLE": "1"}
    (tmp_path / "bad.json").write_text("{nope")
    assert main(["env", "diff", str(tmp_path / "bad.json")]) == 2
    assert "not a fingerprint json" in " ".join(capsys.readouterr().err.lower().split())


def test_compare_gates_a_ci_job_as_a_subprocess(two_runs):
    db, a, b = two_runs
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "compare", str(a), str(b), "--store", str(db)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "verdict: regression" in r.stdout and "Traceback" not in r.stderr


def test_an_impossible_mfu_is_flagged_in_the_list_and_the_run(store_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    with Store(store_path) as st:
        rid = save_run(st, "bench-train", "wrong-params", {"batch": 8}, {"tokens_per_second": 9000.0, "mfu_ratio": 1.52},
                       fingerprint={})
    assert main(["runs", "list", "--store", str(store_path)]) == 0
    out = capsys.readouterr().out
    assert "mfu_ratio=1.52 (impossible" in out
    assert main(["runs", "show", str(rid), "--store", str(store_path)]) == 0
    out = capsys.readouterr().out
    assert "MFU 152%" in out and "impossible" in out and "FLOPs per token" in out


def test_compare_shows_the_notes_made_between_the_runs(store_path, step_times, capsys):
    """`note --help` promises the next comparison shows the change; `compare` said "nothing in
    configuration or environment" although a note sat between the two runs."""
    from gpulens.runs import add_note

    rng = np.random.default_rng(6)
    with Store(store_path) as st:
        a = save_run(st, "bench-train", "small", {"batch": 8}, {}, {"step_seconds": step_times(rng, 0.2)},
                     fingerprint={"driver": "1"}, started=1000.0, ended=1100.0)
        add_note(st, "before the reference", t=900.0)
        add_note(st, "moved the job to the new rack", t=1500.0)
        b = save_run(st, "bench-train", "small", {"batch": 8}, {}, {"step_seconds": step_times(rng, 0.2)},
                     fingerprint={"driver": "1"}, started=2000.0, ended=2100.0)
    main(["compare", str(a), str(b), "--store", str(store_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert "moved the job to the new rack" in out and "before the reference" not in out
    assert "nothing in configuration" not in out
    main(["compare", str(a), str(b), "--store", str(store_path), "--format", "json"])
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert [n["text"] for n in notes] == ["moved the job to the new rack"]
