"""`gpulens diagnose` end to end: a replayed store in, text for people or JSON for scripts out."""

from __future__ import annotations

import json

from gpulens.cli.main import main


def test_json_lists_findings_with_the_agreed_fields(replayed_store, capsys) -> None:
    assert main(["diagnose", "--store", str(replayed_store), "--job", "h200-demo", "--format", "json"]) == 0
    findings = json.loads(capsys.readouterr().out)
    training = [f for f in findings if f["workload"] == "training"]
    assert {f["kind"] for f in training} == {"input_bound", "checkpoint_stall", "underutilized"}
    for f in training:
        assert {"kind", "workload", "start", "end", "severity", "evidence", "advice"} <= set(f)
        assert isinstance(f["start"], float) and f["end"] >= f["start"]
        assert isinstance(f["advice"], list) and len(f["advice"]) >= 3


def test_text_reads_like_advice(replayed_store, capsys) -> None:
    assert main(["diagnose", "--store", str(replayed_store)]) == 0
    out = capsys.readouterr().out
    assert "input bound" in out and "checkpoint stall" in out and "under" in out.lower()
    assert "What to do, in order" in out and "1. Give the data loader more worker" in " ".join(out.split())
    assert "data wait share: 77%" in out


def test_bad_input_is_one_sentence_and_exit_2(tmp_path, replayed_store, capsys) -> None:
    assert main(["diagnose", "--store", str(tmp_path / "missing.db")]) == 2
    err = capsys.readouterr().err
    assert "no store" in err and "Traceback" not in err
    assert main(["diagnose", "--store", str(replayed_store), "--format", "xml"]) == 2
    assert "--format" in capsys.readouterr().err
    assert main(["diagnose", "--store", str(replayed_store), "--job", "nope"]) == 2
    err = capsys.readouterr().err
    assert "h200-demo" in err and "Traceback" not in err
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    assert main(["diagnose", "--store", str(junk)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_empty_store_says_so(tmp_path, capsys) -> None:
    from gpulens.store import Store

    Store(tmp_path / "e.db").close()
    assert main(["diagnose", "--store", str(tmp_path / "e.db")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # not "No bottleneck found", which reads as a healthy job, nor the GPU-only line: there is nothing in it
    assert "holds no samples yet: nothing to diagnose" in out and "No bottleneck found" not in out


def test_help_teaches(capsys) -> None:
    assert main(["diagnose", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--job" in out and "--format" in out and "gpulens replay" in out


def test_replay_then_diagnose_from_the_command_line(tmp_path, capsys) -> None:
    db = str(tmp_path / "cli.db")
    assert main(["replay", "--store", db]) == 0
    capsys.readouterr()
    assert main(["diagnose", "--store", db, "--format", "json"]) == 0
    kinds = [f["kind"] for f in json.loads(capsys.readouterr().out) if f["workload"] == "training"]
    assert sorted(kinds) == ["checkpoint_stall", "checkpoint_stall", "input_bound", "underutilized"]
