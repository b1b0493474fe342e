"""A --start / --end window that holds none of a store's samples is refused with the store's own span
(exit 2), never answered as if all were well: diagnose said "No bottleneck found ... keep this run as
your baseline", energy "No training steps or requests in the store", scale "No inference requests in the store" and report
wrote an empty page."""

from __future__ import annotations

import pytest

from gpulens.cli.main import main
from gpulens.store import Store
from gpulens.vocab.time import format_time


@pytest.mark.parametrize("argv", [
    ["diagnose", "--start", "2030-01-01"],
    ["diagnose", "--end", "2001-01-01"],
    ["energy", "--start", "2030-01-01"],
    ["scale", "--end", "2001-01-01"],
    ["report", "--start", "2030-01-01", "--end", "2030-01-02"],
])
def test_a_window_beside_the_data_is_refused_with_the_span_it_holds(argv, replayed_store, tmp_path, capsys):
    with Store(replayed_store, readonly=True) as st:
        first, last = st.time_range()
    extra = ["--out", str(tmp_path / "r.html")] if argv[0] == "report" else []
    rc = main([*argv, "--store", str(replayed_store), *extra])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "holds no samples" in err and format_time(first) in err and format_time(last) in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["diagnose", "energy", "report", "scale"])
def test_a_window_inside_the_data_is_answered(command, replayed_store, tmp_path, capsys):
    with Store(replayed_store, readonly=True) as st:
        first, last = st.time_range()
    extra = ["--out", str(tmp_path / "r.html")] if command == "report" else []
    # a window that starts before the data and ends inside it overlaps: it is read, not refused
    rc = main([command, "--store", str(replayed_store), "--start", str(first - 3600), "--end", str((first + last) / 2), *extra])
    capsys.readouterr()
    assert rc == 0
