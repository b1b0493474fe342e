"""A mistyped --store never creates a store (issue 27): every command that only reads (or changes
what was recorded) refuses a path with no store in one sentence, exit 2, and leaves nothing behind:
no file, no folder, no -wal/-shm."""

from __future__ import annotations

import pytest

from gpulens.cli.main import main

# Each command that reads the store, or changes state that only exists in a recorded store.
READ_ONLY_COMMANDS = [
    ["alerts", "list"],
    ["alerts", "export"],
    ["alerts", "silence", "alertname=x", "--for", "1h"],
    ["alerts", "silence", "--list"],
    ["alerts", "silence", "--expire", "1"],
    ["baseline", "show"],
    ["baseline", "freeze", "--all"],
    ["baseline", "reset", "--all"],
    ["runs", "list"],
    ["runs", "show", "1"],
    ["runs", "baseline", "1"],
    ["compare", "1", "2"],
    ["diagnose"],
    ["diagnose", "--slo", "p99_latency<1s"],
    ["report", "--out", "REPORT"],
    ["energy"],
    ["scale"],
    ["query", "gpu_utilization_ratio"],
    ["dashboard", "--listen", "127.0.0.1:0"],
]


@pytest.mark.parametrize("argv", READ_ONLY_COMMANDS, ids=" ".join)
def test_a_read_only_command_refuses_a_missing_store_and_creates_nothing(tmp_path, capsys, argv):
    folder = tmp_path / "no-such-folder"
    store = folder / "typo.db"
    argv = [str(tmp_path / "r.html") if a == "REPORT" else a for a in argv]
    rc = main([*argv, "--store", str(store)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"no store at {store}" in " ".join(err.split()).lower(), err
    first = err.strip().splitlines()[0]
    assert first.startswith("error:") and first.rstrip().endswith("."), err
    assert "Traceback" not in err
    assert not folder.exists(), f"{' '.join(argv)} created {sorted(p.name for p in folder.iterdir())}"
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("argv", READ_ONLY_COMMANDS[::3], ids=" ".join)
def test_a_typo_in_an_existing_folder_leaves_no_file_wal_or_shm(tmp_path, capsys, argv):
    argv = [str(tmp_path / "r.html") if a == "REPORT" else a for a in argv]
    assert main([*argv, "--store", str(tmp_path / "typo.db")]) == 2
    capsys.readouterr()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["query", "gpu_utilization_ratio"], ["diagnose"], ["runs", "list"], ["runs", "show", "1"],
                                  ["alerts", "list"], ["baseline", "show"], ["energy"], ["scale"],
                                  # these open the store to write (compare records its result): the file got a schema
                                  ["compare", "1", "2"], ["runs", "baseline", "1"], ["alerts", "silence", "gpu=1", "--for", "1h"]],
                         ids=" ".join)
def test_an_empty_file_is_said_to_be_empty(tmp_path, capsys, argv):
    """A 0-byte store (touched, or made by a writer that never got to set it up) answered
    'no such table: series' from the reading commands; the file is left as it was."""
    store = tmp_path / "empty.db"
    store.touch()
    assert main([*argv, "--store", str(store)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is empty: nothing was ever recorded in it" in err and "no such table" not in err, err
    assert store.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]
