"""Small things a new user hits in the first hour (issue 13), each through the CLI as a subprocess."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from clirun import run_gpulens

from gpulens.alerts.baseline import BaselineConfig, Baselines
from gpulens.alerts.expr import Selector
from gpulens.alerts.source import StoreSource
from gpulens.cli.main import main
from gpulens.store import Store
from gpulens.vocab import names as wn


def _store_with_a_step_series(path, job: str = "j") -> None:
    with Store(path) as s:
        for i in range(20):
            s.write(wn.TRAIN_STEP_SECONDS, {wn.TRAIN_JOB_LABEL: job, "rank": "0", "host": "h"}, 1000.0 + i, 0.1)


def _one_line_error(r) -> str:  # type: ignore[no-untyped-def]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return " ".join(r.stderr.split())


def test_report_refuses_a_pdf_instead_of_writing_html_into_it(tmp_path):
    db = tmp_path / "s.db"
    _store_with_a_step_series(db)
    out = tmp_path / "r.pdf"
    err = _one_line_error(run_gpulens("report", "--store", str(db), "--out", str(out)))
    assert ".pdf" in err and "HTML (.html)" in err and "Markdown (.md)" in err
    assert not out.exists()


def test_report_without_a_suffix_is_still_html(tmp_path):
    db = tmp_path / "s.db"
    _store_with_a_step_series(db)
    r = run_gpulens("report", "--store", str(db), "--out", str(tmp_path / "report"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "report").read_text().lstrip().lower().startswith("<!doctype html")


def test_markdown_report_keeps_comparisons_and_stays_safe(tmp_path):
    # a job name with a comparison, raw HTML and a Markdown link in it
    job = "p99<=2s <img src=x onerror=alert(1)> [click](javascript:alert(1))"
    db = tmp_path / "s.db"
    _store_with_a_step_series(db, job)
    out = tmp_path / "r.md"
    r = run_gpulens("report", "--store", str(db), "--out", str(out), "--job", job)
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    assert "p99<=2s" in md and "&lt;=" not in md  # readable, not HTML-escaped
    assert "<img" not in md  # no raw HTML from data
    assert "[click](javascript" not in md  # no link from data


def test_baseline_show_names_the_metric_and_lists_the_ones_there_are(tmp_path):
    db = tmp_path / "s.db"
    with Store(db) as st:
        sid = st.series_id(wn.TRAIN_STEP_SECONDS, {wn.TRAIN_JOB_LABEL: "j", "rank": "0", "host": "h"})
        ts = 1_800_000_000.0 + np.arange(0, 400, 1.0)
        st.write_many(zip([sid] * len(ts), ts.tolist(), [1.0] * len(ts), strict=True))
        st.flush()
        src = StoreSource(st)
        src.refresh()
        bl = Baselines(st, src, BaselineConfig(learn_seconds=300, refresh_seconds=60, history_seconds=300))
        bl.track(src.series(Selector(wn.TRAIN_STEP_SECONDS)))
        bl.update(ts[-1])
    err = _one_line_error(run_gpulens("baseline", "show", "no_such_metric", "--store", str(db)))
    assert "no baseline for no_such_metric" in err.lower() and "No baselines yet" not in err
    assert wn.TRAIN_STEP_SECONDS in err
    # the metric that has one still shows it
    ok = run_gpulens("baseline", "show", wn.TRAIN_STEP_SECONDS, "--store", str(db))
    assert ok.returncode == 0 and wn.TRAIN_STEP_SECONDS in ok.stdout


def test_baseline_show_in_a_store_without_baselines_says_none_yet(tmp_path):
    db = tmp_path / "s.db"
    _store_with_a_step_series(db)
    r = run_gpulens("baseline", "show", "no_such_metric", "--store", str(db))
    assert r.returncode == 0 and "No baselines yet" in r.stdout


def test_env_diff_refuses_json_that_is_not_a_fingerprint(tmp_path):
    other = tmp_path / "package.json"
    other.write_text(json.dumps({"name": "left-pad", "version": "1.3.0"}))
    err = _one_line_error(run_gpulens("env", "diff", str(other)))
    assert "not a gpulens fingerprint" in err and "gpulens env --format json" in err


def test_env_diff_of_a_real_fingerprint_still_works(tmp_path):
    fp = run_gpulens("env", "--format", "json")
    assert fp.returncode == 0, fp.stderr
    before = tmp_path / "before.json"
    before.write_text(fp.stdout)
    r = run_gpulens("env", "diff", str(before))
    assert r.returncode == 0, r.stderr


def test_python_dash_m_gpulens_runs_the_cli():
    r = run_gpulens("--version", entry="python -m")
    assert r.returncode == 0 and r.stdout.startswith("gpulens "), (r.stdout, r.stderr)


def test_query_max_points_holds_without_a_window(replayed_store):
    """`query --max-points N` returned every raw sample when no --since was given (995 rows for 5)."""
    r = run_gpulens("query", "gpu_power_watts", "--store", str(replayed_store), "--max-points", "5", "--format", "json")
    assert r.returncode == 0, r.stderr
    (series,) = json.loads(r.stdout)
    assert 1 <= len(series["points"]) <= 5
    with Store(replayed_store, readonly=True) as st:
        (raw,) = st.query("gpu_power_watts")
    # buckets of raw samples: their means lie within the samples' range and their times within the span
    assert min(raw.value) <= min(v for _, v in series["points"]) <= max(v for _, v in series["points"]) <= max(raw.value)
    assert raw.t[0] <= series["points"][0][0] and series["points"][-1][0] <= raw.t[-1]


def test_query_table_names_labels_and_what_a_row_is(replayed_store):
    r = run_gpulens("query", "gpu_power_watts", "--store", str(replayed_store), "--max-points", "5")
    assert r.returncode == 0, r.stderr
    assert "{'" not in r.stdout, r.stdout
    assert "gpu=0" in r.stdout
    assert "bucket means of raw samples" in " ".join(r.stdout.split()), r.stdout  # a title may wrap


def test_query_table_keeps_the_gpu_uuid_whole(replayed_store):
    """The series' labels were the table's title, folded at the table's width: the uuid cut in two."""
    r = run_gpulens("query", "gpu_power_watts", "--store", str(replayed_store), "--since", "1ms")  # two columns wide
    assert r.returncode == 0, r.stderr
    with Store(replayed_store, readonly=True) as st:
        (key,) = st.series("gpu_power_watts")
    assert f"uuid={key.labels['uuid']}" in r.stdout and "1 point)" in " ".join(r.stdout.split()), r.stdout


def test_query_with_a_label_no_series_has_says_which_values_there_are(replayed_store):
    """`query gpu_utilization_ratio --label gpu=7` on a one-GPU store printed nothing, exit 0."""
    msg = _one_line_error(run_gpulens("query", "gpu_utilization_ratio", "--store", str(replayed_store), "--label", "gpu=7"))
    assert "No gpu_utilization_ratio series has gpu=7" in msg and "Its series have gpu=0" in msg, msg
    msg = _one_line_error(run_gpulens("query", "gpu_utilization_ratio", "--store", str(replayed_store), "--label", "gpus=0"))
    assert "no label gpus" in msg, msg
    long = "x" * 5000
    msg = _one_line_error(run_gpulens("query", "gpu_utilization_ratio", "--store", str(replayed_store), "--label", f"{long}={long}"))
    assert "(10,001 characters)" in msg and "(5,000 characters)" in msg and len(msg) < 400, msg


def test_baseline_freeze_help_example_selects_a_real_baseline(tmp_path):
    """`baseline freeze --help` said "Default: all" and then asked which; its `--label job=...`
    example matched nothing (the label is train_job). The help's example, run, freezes one."""
    help_text = " ".join(run_gpulens("baseline", "freeze", "--help").stdout.split())
    assert "Default: all" not in help_text and "--label job=" not in help_text
    example = re.search(r"gpulens baseline freeze (\S+) --label (\S+)=llama", help_text)
    assert example, help_text
    db = tmp_path / "s.db"
    with Store(db) as st:
        sid = st.series_id(example.group(1), {example.group(2): "llama", "rank": "0", "host": "h"})
        ts = 1_800_000_000.0 + np.arange(0, 400, 1.0)
        st.write_many(zip([sid] * len(ts), ts.tolist(), [1.0] * len(ts), strict=True))
        st.flush()
        src = StoreSource(st)
        src.refresh()
        bl = Baselines(st, src, BaselineConfig(learn_seconds=300, refresh_seconds=60, history_seconds=300))
        bl.track(src.series(Selector(example.group(1))))
        bl.update(ts[-1])
    r = run_gpulens("baseline", "freeze", example.group(1), "--label", f"{example.group(2)}=llama", "--store", str(db))
    assert r.returncode == 0 and "Froze 1 baseline" in r.stdout, (r.stdout, r.stderr)


def test_eval_compare_help_shows_the_jsonl_shape_whole():
    """The help showed `{"id", ""}`: the `<metric>` placeholder was eaten by the help renderer."""
    out = run_gpulens("eval", "compare", "--help").stdout
    text = "".join(ch for ch in out if not ch.isspace() and ch not in "│╭╮╰╯─")  # wrapping and boxes differ by rich version
    assert '{"id",""}' not in text, out
    if "per-exampleresults" in text:  # typer at its floor (0.18) shows no help for arguments
        assert '{"id":"q1","acc":1}' in text, out


LONG = "x" * 5000


def test_a_5000_character_value_is_quoted_cut_not_echoed_whole(tmp_path, replayed_store):
    """Each of these echoed the whole value: 5,000 characters of error on the terminal."""
    cases = [
        ["record", "--backend", LONG, "--out", str(tmp_path / "r.jsonl")],
        ["export", "grafana", "--metric-names", LONG],
        ["env", "--format", LONG],
        ["agent", "--backend", "fake:1", "--listen", LONG, "--duration", "1s", "--store", str(tmp_path / "a.db")],
        ["agent", "--backend", "fake:1", "--fault", LONG, "--listen", "off", "--store", str(tmp_path / "a.db")],
        ["bench", "serve", "--url", "http://127.0.0.1:1/", "--rate", "1", "--header", LONG, "--no-store"],
        ["bench", "serve", "--url", "http://127.0.0.1:1/", "--rate", "1", "--slo", LONG, "--no-store"],
        # a store of its own: the default .gpulens/gpulens.db exists only where a demo ran
        ["report", "--out", str(tmp_path / "r.html"), "--baseline", LONG, "--store", str(replayed_store)],
        ["bench", "serve", "--url", LONG, "--rate", "1", "--no-store"],
        ["agent", "--backend", "fake:1", "--ingest", LONG, "--listen", "off", "--store", str(tmp_path / "a.db")],
        ["agent", "--backend", "fake:1", "--notify", LONG, "--listen", "off", "--store", str(tmp_path / "a.db")],
    ]
    for args in cases:
        r = run_gpulens(*args)
        assert r.returncode == 2, (args[:2], r.stderr[:300])
        assert "(5,000 characters)" in r.stderr and len(r.stderr) < 600, (args[:2], r.stderr[:300])


def test_control_characters_a_user_typed_are_shown_escaped_in_an_error(tmp_path):
    """A store path holding ESC [2J (clear the screen) reached the terminal raw inside the error."""
    r = run_gpulens("query", "m", "--store", str(tmp_path / "\x01\x1b[2Jx.db"))
    assert r.returncode == 2
    assert "\x1b" not in r.stderr and "\x01" not in r.stderr, repr(r.stderr)
    assert "\\x01\\x1b[2Jx.db" in r.stderr, r.stderr


@pytest.mark.parametrize("argv", [
    ["replay", "--store", "{db}", "--job", ""],
    ["replay", "--store", "{db}", "--service", ""],
    ["replay", "--store", "{db}", "--host", " "],
    ["diagnose", "--store", "{db}", "--job", ""],
    ["energy", "--store", "{db}", "--service", ""],
    ["agent", "--backend", "fake:1", "--store", "{db}", "--host", ""],
], ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_an_empty_label_is_refused_where_it_is_typed(tmp_path, capsys, argv):
    """`--job ''` stored steps under a name no one can type back; as a filter it selected every job."""
    db = tmp_path / "s.db"
    assert main([a.format(db=db) for a in argv]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"Invalid value for '{argv[-2]}': is empty" in said and "Traceback" not in said
    assert not db.exists()  # refused while parsing, before anything is written
