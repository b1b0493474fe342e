"""`gpulens tune train` end to end on a real CPU torch script whose data loader is input-bound."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from gpulens.cli.main import main
from gpulens.runs import get_run, list_runs
from gpulens.store import Store
from gpulens.vocab import names as N


def _tune(capsys, store_path, *args: str) -> tuple[int, dict]:
    rc = main(["tune", "train", "--store", str(store_path), "--format", "json", "--repeats", "1", *args])
    out = capsys.readouterr().out
    return rc, json.loads(out) if rc == 0 else {}


def test_tune_train_keeps_more_workers_rolls_back_a_smaller_batch(capsys, tmp_path, train_script):
    store = tmp_path / "tune.db"
    html = tmp_path / "tune.html"
    rc, r = _tune(capsys, store, "--knob", "workers=0,2", "--knob", "batch=16,4", "--html", str(html), "--",
                  *train_script, "--batch-size", "{batch}", "--num-workers", "{workers}", "--steps", "{steps}",
                  # a data wait two workers halve by far more than a loaded CI machine's noise, and a step cost
                  # that a batch of 4 cannot hide behind its data (with both waits data-bound, 4 and 16 tie)
                  "--io-ms", "8", "--step-overhead-ms", "20")
    assert rc == 0
    assert r["metric"] == "tokens_per_second"
    assert "input_bound" in [f["kind"] for f in r["findings"]]
    by_change = {tuple(t["changed"].items()): t for t in r["trials"]}
    workers = by_change[(("workers", "2"),)]
    assert workers["verdict"] == "kept" and workers["finding"] == "input_bound", r["trials"]
    assert workers["speedup_ci"][0] > 1  # the interval excludes 1
    smaller = by_change[(("batch", "4"),)]
    assert smaller["verdict"] == "rolled_back" and smaller["speedup"] < 1, r["trials"]
    assert r["best"]["knobs"] == {"workers": "2", "batch": "16"}
    assert r["best"]["ci"][0] > 1
    # Every trial is a run with its command, knob values and fingerprint; the tune is one too.
    with Store(store) as s:
        trials = list_runs(s, kind="tune-train")
        assert len(trials) == 1 + len(r["trials"])
        best = get_run(s, r["best"]["run_id"])
        assert best.config["knobs"] == {"workers": "2", "batch": "16"} and "--num-workers 2" in best.config["command"]
        assert best.fingerprint["python"] and best.verdict == "good"
        assert get_run(s, r["run_id"]).kind == "tune"
    assert "input_bound" in html.read_text() and "Reproduce" in html.read_text()
    # The reproduce commands run (side by side, to keep the test short), and their monitor writes
    # where the environment says.
    procs = {}
    for key, workers_value in (("best", "2"), ("baseline", "0")):
        cmd = shlex.split(r["reproduce"][key])
        assert cmd[cmd.index("--num-workers") + 1] == workers_value
        procs[key] = subprocess.Popen(cmd, env=dict(os.environ, GPULENS_STORE=str(tmp_path / f"{key}.db")), stderr=subprocess.PIPE)
    for key, proc in procs.items():
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err.decode()[-500:]
        with Store(tmp_path / f"{key}.db") as s:
            assert len(s.events(N.EV_TRAIN_STEP)) >= 20


def test_an_oom_or_a_crash_in_a_trial_is_rolled_back_and_the_loop_goes_on(capsys, tmp_path, train_script):
    # The planner (a 0.1b model at 512 tokens on an L4) predicts batch 1024 cannot fit: it is skipped, not run.
    # Batch 48 fits by the plan (64 no longer does on the L4's usable 22.5 GiB) but not by the script's
    # memory limit: a real OOM in the trial.
    html = tmp_path / "tune.html"
    rc, r = _tune(capsys, tmp_path / "tune.db", "--model", "0.1b", "--gpu", "l4", "--seq", "512", "--html", str(html),
                  "--knob", "workers=0,2", "--knob", "batch=16,1024,48,oops", "--",
                  *train_script, "--memory-limit-samples", "32", "--batch-size", "{batch}", "--num-workers", "{workers}",
                  "--steps", "{steps}", "--io-ms", "8")  # as above: the gain stands above a loaded machine's noise
    assert rc == 0
    verdicts = [(t["changed"], t["verdict"]) for t in r["trials"]]
    assert verdicts == [({"workers": "2"}, "kept"), ({"batch": "48"}, "failed"), ({"batch": "oops"}, "failed")], r["trials"]
    oom, crash = r["trials"][1], r["trials"][2]
    assert "out of memory" in oom["reason"] and "rolled back to workers=2, batch=16" in oom["reason"]
    assert "exited with code 2" in crash["reason"] and "invalid int value" in crash["reason"]
    assert r["best"]["knobs"] == {"workers": "2", "batch": "16"}
    assert [s["change"] for s in r["skipped"]] == ["batch=1024"]
    assert "does not fit" in r["skipped"][0]["why"]
    assert "skipped batch=1024" in html.read_text()


def test_beginner_mode_proposes_knobs_from_the_placeholders_and_stops_when_the_finding_is_addressed(capsys, tmp_path, train_script):
    # No {steps}: the script would run 10 000 steps, and the tune stops it after --steps.
    rc, r = _tune(capsys, tmp_path / "tune.db", "--yes", "--", *train_script, "--steps", "10000",
                  "--batch-size", "{batch=16}", "--num-workers", "{workers=0}")
    assert rc == 0
    assert any(n.startswith("beginner mode: proposed") and "workers=0," in n for n in r["notes"])
    assert r["trials"][0]["changed"].keys() == {"workers"} and r["trials"][0]["verdict"] == "kept"
    # Only the knobs that address a finding run; the batch (no finding asks for it) is never tried.
    assert all("batch" not in t["changed"] for t in r["trials"])
    assert "finding" in r["stop_reason"] or "bottleneck" in r["stop_reason"]


def test_a_trial_whose_loss_turns_nan_fails_and_is_rolled_back(capsys, tmp_path, train_script):
    rc, r = _tune(capsys, tmp_path / "tune.db", "--knob", "lr_bug=-1,3", "--", *train_script,
                  "--nan-after", "{lr_bug}", "--steps", "{steps}")
    assert rc == 0
    (trial,) = r["trials"]
    assert trial["verdict"] == "failed" and "the loss became NaN at step 3" in trial["reason"]
    assert r["best"]["knobs"] == {"lr_bug": "-1"}


def test_declining_a_proposed_change_skips_it(tmp_path, train_script):
    from gpulens.tune.command import CommandTemplate
    from gpulens.tune.loop import Observer
    from gpulens.tune.train import TrainTuneSpec, proposed_knobs, tune_train

    class Decline(Observer):
        asked: list[str] = []

        def approve(self, change, reason):
            self.asked.append(change.text)
            return False

    cmd = CommandTemplate.of([*train_script, "--num-workers", "{workers=0}", "--steps", "{steps}"])
    spec = TrainTuneSpec(cmd, proposed_knobs(cmd), max_runs_per_trial=1, stop_when_clear=True)
    with Store(tmp_path / "tune.db") as s:
        r = tune_train(spec, s, Decline())
    assert r.trials == [] and Decline.asked == ["workers=2"]
    assert r.skipped[0]["change"] == "workers=2" and "declined" in r.skipped[0]["why"]
    assert r.best is r.baseline and r.speedup == 1.0
