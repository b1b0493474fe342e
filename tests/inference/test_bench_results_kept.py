"""`bench serve` never throws a run's results away (issue 27): its figures are printed before the
store write is tried, every output that can be written still is, and the error says what was kept
and what was not. The store fails for real: on a full tmpfs (where mounting is allowed), or at a
path that is a folder (everywhere)."""

from __future__ import annotations

import csv

import pytest
from testlib import fill_disk, tiny_tmpfs

from gpulens.cli.main import main


@pytest.fixture
def full_store_path(tmp_path):
    with tiny_tmpfs(tmp_path, "256k") as mnt:
        fill_disk(mnt)
        yield mnt / "g.db"


def _run(test_server, tmp_path, store, *extra: str) -> int:
    url = f"{test_server}/v1/completions?ttft_ms=5&itl_ms=1"
    return main(["bench", "serve", "--url", url, "--rate", "20", "--duration", "1s", "--max-tokens", "4",
                 "--csv", str(tmp_path / "req.csv"), "--store", str(store), *extra])


def test_a_full_store_disk_still_prints_the_figures_and_says_what_was_kept(test_server, tmp_path, full_store_path, capsys):
    rc = _run(test_server, tmp_path, full_store_path)
    out, err = capsys.readouterr()
    said = " ".join(err.split())
    assert rc == 4, said  # the store's disk is full
    assert "requests: 20 (20 ok" in out and "latency" in out  # the figures, though the store write failed
    assert "is full" in said and "figures are printed above" in said, said
    assert f"not kept: the run in the store {full_store_path}" in said, said
    assert f"kept: the CSV {tmp_path / 'req.csv'}" in said, said
    assert len(list(csv.DictReader((tmp_path / "req.csv").open()))) == 20  # the other output was still written


def test_a_store_path_that_is_a_folder_still_prints_the_figures(test_server, tmp_path, capsys):
    store = tmp_path / "a-folder"
    store.mkdir()
    rc = _run(test_server, tmp_path, store, "--format", "json")
    out, err = capsys.readouterr()
    said = " ".join(err.split())
    assert rc == 2, said
    import json

    figures = json.loads(out)  # the whole JSON document, with no run id
    assert figures["requests"]["ok"] == 20 and figures["run_id"] is None
    assert "is a folder" in said and "not kept: the run in the store" in said and "kept: the CSV" in said, said
