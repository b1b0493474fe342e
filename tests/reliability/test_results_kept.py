"""Files a command writes are whole or absent (issue 27): `report`, `export grafana` and `alerts
export` write through one atomic writer (gpulens.files), so a write that fails leaves no 0-byte or
half file, keeps a file that was there before as it was, and says which of the two it did.

Two real failures: a full disk (a tiny tmpfs, where mounting is allowed) and a destination that is
a folder (everywhere; a read-only folder would not do, as root writes there anyway).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from testlib import fill_disk, tiny_tmpfs
from tracelib import h200_lines, write_trace

from gpulens.cli.main import main
from gpulens.files import AtomicFile, write_atomically
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store


@pytest.fixture(scope="module")
def h200_store(tmp_path_factory, h200_trace) -> Path:
    """The first 40 lines of the H200 session: enough for every output, and a report that builds fast."""
    folder = tmp_path_factory.mktemp("trace")
    db = folder / "s.db"
    with Store(db) as st:
        import_trace(write_trace(folder / "t", h200_lines(h200_trace, 40), h200_trace), st)
    return db


COMMANDS = {
    "report-html": lambda db, out: ["report", "--store", str(db), "--out", str(out)],
    "report-md": lambda db, out: ["report", "--store", str(db), "--out", str(out)],
    "export-grafana": lambda db, out: ["export", "grafana", "--out", str(out)],
    "alerts-export": lambda db, out: ["alerts", "export", "--format", "prometheus", "--store", str(db), "--out", str(out)],
}
SUFFIX = {"report-html": ".html", "report-md": ".md", "export-grafana": ".json", "alerts-export": ".yml"}


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 256 KiB tmpfs (filled by the test, after it placed what it needs there)."""
    with tiny_tmpfs(tmp_path, "256k") as mnt:
        yield mnt


def _said(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "old-file"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_write_on_a_full_disk_leaves_no_partial_file(full_disk, h200_store, capsys, command, existing):
    out = full_disk / f"out{SUFFIX[command]}"
    if existing:
        out.write_text("the old file\n")
    fill_disk(full_disk)
    assert main(COMMANDS[command](h200_store, out)) == 4  # a full disk, not bad input: the store's code
    said = _said(capsys)
    assert "Cannot write" in said and "Traceback" not in said, said
    if existing:
        assert out.read_text() == "the old file\n"  # untouched, and it says so
        assert f"{out} is as it was before" in said, said
    else:
        assert not out.exists()  # no 0-byte file, and it says so
        assert "no file was left" in said or "was not written" in said, said
    assert _leftovers(full_disk) == []


@pytest.mark.parametrize("command", ["report-html", "export-grafana", "alerts-export"])
def test_a_destination_that_is_a_folder_is_one_sentence_and_left_alone(tmp_path, h200_store, capsys, command):
    out = tmp_path / f"out{SUFFIX[command]}"
    (out / "inside").mkdir(parents=True)
    assert main(COMMANDS[command](h200_store, out)) == 2
    said = _said(capsys)
    assert "Cannot write" in said and "Traceback" not in said, said
    assert out.is_dir() and [p.name for p in out.iterdir()] == ["inside"]
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", ["report-html", "export-grafana", "alerts-export"])
def test_an_empty_destination_is_the_current_folder_and_said_so(tmp_path, h200_store, capsys, command, monkeypatch):
    """--out "" is '.', which the rename onto it answered "Device or resource busy"."""
    monkeypatch.chdir(tmp_path)
    assert main(COMMANDS[command](h200_store, "")) == 2
    said = _said(capsys)
    assert "Cannot write" in said and "it is a folder" in said and "busy" not in said, said
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", ["report-html", "export-grafana", "alerts-export"])
def test_a_missing_folder_is_named_with_what_to_do(tmp_path, h200_store, capsys, command):
    """Not "No such file or directory ... Free some space": the folder that is missing, and to create it."""
    out = tmp_path / "not" / "made" / f"out{SUFFIX[command]}"
    assert main(COMMANDS[command](h200_store, out)) == 2
    said = _said(capsys)
    assert f"the folder {out.parent} does not exist" in said and "Create the folder" in said, said
    assert "Free some space" not in said and "Traceback" not in said, said
    assert not (tmp_path / "not").exists()


def test_the_atomic_writer_replaces_whole_and_keeps_the_mode(tmp_path):
    out = tmp_path / "f.txt"
    out.write_text("old")
    out.chmod(0o640)
    write_atomically(out, "new", what="the file", hint="")
    assert out.read_text() == "new" and out.stat().st_mode & 0o777 == 0o640
    fresh = write_atomically(tmp_path / "g.bin", b"\x00\x01", what="the file", hint="")
    assert fresh.read_bytes() == b"\x00\x01" and fresh.stat().st_mode & 0o077 != 0  # not mkstemp's 0600
    assert _leftovers(tmp_path) == []


def test_a_salvaged_file_keeps_only_complete_lines(tmp_path):
    out = tmp_path / "rec.jsonl"
    f = AtomicFile(out)
    f.file.write("one\ntwo\nthr")  # a line cut short, as by a full disk
    f.file.flush()
    assert f.salvage() == 2
    assert out.read_text() == "one\ntwo\n" and _leftovers(tmp_path) == []
    empty = AtomicFile(tmp_path / "none.jsonl")
    empty.file.write("no newline yet")
    assert empty.salvage() == 0 and not (tmp_path / "none.jsonl").exists()


def test_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "reports").mkdir()
    target = tmp_path / "reports" / "2026-12.html"
    target.write_text("old")
    link = tmp_path / "latest.html"
    link.symlink_to(target)
    write_atomically(link, "new", what="the report", hint="")
    assert link.is_symlink() and link.resolve() == target and target.read_text() == "new"
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "reports") == []


def test_a_pipe_is_written_to_not_replaced_by_a_file(tmp_path):
    """`--out /dev/stdout` or a FIFO: the rename of an atomic write would have put a regular file in
    its place (as root, /dev/full became one and its 'no space' went unseen: exit 0)."""
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomically(fifo, "through the pipe\n", what="the dashboard", hint="")
    reader.join(timeout=60)
    assert got == [b"through the pipe\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_a_device_that_refuses_the_write_is_one_sentence_and_stays_a_device(capsys):
    rc = main(["export", "grafana", "--out", "/dev/full"])
    err = capsys.readouterr().err
    assert rc == 4 and "Cannot write the dashboard /dev/full: No space left on device" in " ".join(err.split()), err
    assert Path("/dev/full").is_char_device()


STORE_OVERWRITERS = {
    "report-html-over-its-own-store": lambda db: ["report", "--store", str(db), "--out", str(db), "--format", "html"],
    "alerts-export-over-its-own-store": lambda db: ["alerts", "export", "--store", str(db), "--out", str(db)],
    "export-grafana": lambda db: ["export", "grafana", "--out", str(db)],
    "record": lambda db: ["record", "--backend", "fake:1", "--interval", "100ms", "--duration", "300ms", "--out", str(db)],
}


@pytest.mark.parametrize("command", list(STORE_OVERWRITERS))
def test_no_output_is_written_over_a_store(tmp_path, h200_store, capsys, command):
    """An output path that names a store (even the one being read) is refused: the atomic rename
    would have replaced the database with a report, and the store was gone (exit 0)."""
    db = tmp_path / "s.db"
    shutil.copy(h200_store, db)
    before = db.read_bytes()
    assert main(STORE_OVERWRITERS[command](db)) == 2
    said = _said(capsys)
    assert "is an SQLite database" in said and "Traceback" not in said, said
    assert db.read_bytes() == before and _leftovers(tmp_path) == []
    import sqlite3

    with sqlite3.connect(db) as conn:  # still a store, with what it had
        assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] > 0
