"""`gpulens alerts` and `gpulens baseline` as a user meets them, on a store filled by `gpulens replay`
of the bundled H200 session (real store file, real rule packs), and the Prometheus export checked by
promtool."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from testlib import which_or_skip

from gpulens.alerts.baseline import load_baselines
from gpulens.alerts.engine import load_alerts
from gpulens.cli.main import main
from gpulens.store import Store


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, h200_trace):
    """A store after `gpulens replay --learn 3s`: learned baselines and the alerts of the session."""
    db = tmp_path_factory.mktemp("alerts-cli") / "s.db"
    assert main(["replay", str(h200_trace), "--store", str(db), "--speed", "max", "--learn", "3s"]) == 0
    return db


def test_list_table_and_json(replayed, capsys):
    assert main(["alerts", "list", "--store", str(replayed)]) == 0
    out = capsys.readouterr().out
    assert "TrainCheckpointSlow" in out and "resolved" in out
    assert main(["alerts", "list", "--store", str(replayed), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    with Store(replayed) as st:
        stored = load_alerts(st)
    assert [r["id"] for r in rows] == [a.id for a in stored] and rows
    assert {"TrainDataWaitHigh", "TrainCheckpointSlow"} <= {r["rule"] for r in rows}
    assert all(r["fired_at"] is not None and r["advice"] for r in rows)


def test_list_active_is_empty_after_the_session_resolves(replayed, capsys):
    assert main(["alerts", "list", "--store", str(replayed), "--active", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_bad_inputs_are_one_sentence_and_exit_2(tmp_path, replayed, capsys):
    assert main(["alerts", "list", "--store", str(tmp_path / "none.db")]) == 2
    assert main(["alerts", "list", "--store", str(replayed), "--format", "xml"]) == 2
    assert main(["alerts", "export", "--format", "grafana"]) == 2
    assert main(["alerts", "silence", "--store", str(replayed)]) == 2
    assert main(["alerts", "silence", "gpu", "--store", str(replayed)]) == 2
    assert main(["baseline", "reset", "--store", str(replayed)]) == 2
    assert main(["baseline", "show", "--store", str(replayed), "--label", "job"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 7


def test_silence_add_list_expire(tmp_path, capsys):
    db = tmp_path / "s.db"
    Store(db).close()
    assert main(["alerts", "silence", "alertname=GpuXid", 'xid=~"79|48"', "--for", "1h", "--comment", "RMA 12", "--store", str(db)]) == 0
    assert main(["alerts", "silence", "--list", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "1: alertname=GpuXid xid=~79|48" in out and "RMA 12" in out
    assert main(["alerts", "silence", "--expire", "1", "--store", str(db)]) == 0
    assert main(["alerts", "silence", "--list", "--store", str(db)]) == 0
    assert "No silences in force." in capsys.readouterr().out
    assert main(["alerts", "silence", "--expire", "1", "--store", str(db)]) == 2


def test_baseline_show_freeze_reset(tmp_path, replayed, capsys):
    db = tmp_path / "copy.db"
    with Store(replayed) as src:
        src.backup_to(db)  # a private copy: freeze/reset must not disturb the other tests
    assert main(["baseline", "show", "train_step_seconds", "--store", str(db), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["series"] == "train_step_seconds" and r["state"] == "ready" for r in rows)
    r = rows[0]
    assert r["band_low"] < r["median"] < r["band_high"] and r["samples"] >= 10
    assert main(["baseline", "show", "--store", str(db)]) == 0
    assert "train_data_wait_ratio" in capsys.readouterr().out

    assert main(["baseline", "freeze", "train_step_seconds", "--store", str(db)]) == 0
    with Store(db) as st:
        states = {b.name: b.state for b in load_baselines(st)}
    assert states["train_step_seconds"] == "frozen" and states["train_data_wait_ratio"] == "ready"

    assert main(["baseline", "reset", "--all", "--store", str(db)]) == 0
    with Store(db) as st:
        after = load_baselines(st)
    assert after and all(b.state == "learning" and b.stats is None for b in after)


def test_baseline_freeze_and_reset_of_nothing_say_what_there_is(tmp_path, replayed, capsys):
    """A mistyped label froze or reset nothing and said so with exit 0; `show` refuses it (exit 2)."""
    db = tmp_path / "copy.db"
    with Store(replayed) as src:
        src.backup_to(db)
    with Store(db) as st:
        before = [(b.name, b.labels, b.state) for b in load_baselines(st)]
    for verb in ("freeze", "reset"):
        assert main(["baseline", verb, "--label", "train_job=nosuch", "--store", str(db)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "There is no baseline for --label train_job=nosuch" in err and "train_step_seconds" in err, err
    with Store(db) as st:
        assert [(b.name, b.labels, b.state) for b in load_baselines(st)] == before  # nothing touched


def _promtool_rules(path) -> subprocess.CompletedProcess:
    return subprocess.run([which_or_skip("promtool"), "check", "rules", str(path)], capture_output=True, text=True)


def test_export_without_store_passes_promtool(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no .gpulens/gpulens.db here: no learned thresholds
    out = tmp_path / "rules.yml"
    assert main(["alerts", "export", "--format", "prometheus", "--out", str(out)]) == 0
    res = _promtool_rules(out)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(out.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]  # not the scaling recording rules
    by_name: dict[str, list[dict]] = {}
    for r in rules:
        by_name.setdefault(r["alert"], []).append(r)
    # Every code of the catalog with its own severity; 79 is critical, 13 a warning.
    xid79 = next(r for r in by_name["GpuXid"] if r["labels"].get("xid") == "79")
    assert xid79["labels"]["severity"] == "critical" and 'xid="79"' in xid79["expr"] and "reboot" in xid79["annotations"]["action"]
    assert next(r for r in by_name["GpuXid"] if r["labels"].get("xid") == "13")["labels"]["severity"] == "warning"
    assert by_name["GpuClockSlowdown"][0]["for"] == "1m" and by_name["GpuLost"][0]["expr"] == "gpu_up == 0"
    assert "TrainStepTimeHigh" not in by_name and "# left out: TrainStepTimeHigh" in out.read_text()


def test_export_with_learned_baselines_passes_promtool(tmp_path, replayed):
    out = tmp_path / "rules.yml"
    assert main(["alerts", "export", "--store", str(replayed), "--out", str(out)]) == 0
    res = _promtool_rules(out)
    assert res.returncode == 0, res.stdout + res.stderr
    rules = [r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"] if "alert" in r]
    step = [r for r in rules if r["alert"] == "TrainStepTimeHigh"]
    with Store(replayed) as st:
        learned = [b for b in load_baselines(st, "train_step_seconds") if b.ready]
    assert len(step) == len(learned) >= 1
    # The threshold is the stored band: above the learned median, on that series only.
    b = learned[0]
    threshold = float(step[0]["expr"].rsplit(">", 1)[1])
    assert threshold > b.stats.median
    assert f'train_job="{b.labels["train_job"]}"' in step[0]["expr"]
    assert "TrainNanLoss" not in {r["alert"] for r in rules}


@pytest.mark.parametrize(("args", "said"), [
    (["alerts", "silence", "--list", "--expire", "1"], "Give --list or --expire, not both."),
    (["alerts", "silence", "--list", "alertname=GpuXid"], "--list takes no label matchers."),
    (["alerts", "silence", "--expire", "1", "gpu=0"], "--expire takes no label matchers."),
    (["baseline", "freeze", "train_step_seconds", "--all"], "--all freezes every baseline"),
    (["baseline", "reset", "--all", "--label", "rank=0"], "--all resets every baseline"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_options_that_contradict_each_other_are_refused(replayed, capsys, args, said):
    """One of the two was silently dropped: --expire won over --list, the name over --all."""
    assert main([*args, "--store", str(replayed)]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
