"""`tune --html` writes through the atomic writer (issue 27): a report that cannot be written leaves
no 0-byte or half file, says so in one sentence, and the tune's result is printed (and stored) first."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testlib import fill_disk, tiny_tmpfs

from gpulens.cli.main import main
from gpulens.runs import list_runs
from gpulens.store import Store


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def _tune(url: str, store, html) -> list[str]:  # noqa: ANN001
    return ["tune", "serve", "--url", url, "--slo", "p99_latency<=1s", "--knob", "max_connections=1,2", "--rate", "20",
            "--duration", "0.3s", "--max-probes", "2", "--yes", "--store", str(store), "--format", "json", "--html", str(html)]


def _leftovers(folder) -> list[str]:  # noqa: ANN001
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_an_html_report_that_cannot_be_written_leaves_nothing_and_keeps_the_result(tmp_path, endpoint, capsys):
    out = tmp_path / "tune.html"
    (out / "inside").mkdir(parents=True)  # a destination that is a folder: the rename fails
    assert main(_tune(endpoint, tmp_path / "s.db", out)) == 2
    said = capsys.readouterr()
    err = " ".join(said.err.split())
    assert "Cannot write" in err and "Traceback" not in err, err
    assert json.loads(said.out)["best"]["knobs"]  # what the tune found was printed before the write
    assert out.is_dir() and [p.name for p in out.iterdir()] == ["inside"]
    assert _leftovers(tmp_path) == []
    with Store(tmp_path / "s.db", readonly=True) as st:
        assert list_runs(st, kind="tune-serve")


def test_an_html_report_on_a_full_disk_leaves_no_partial_file(tmp_path, endpoint, capsys):
    with tiny_tmpfs(tmp_path, "64k") as mnt:
        fill_disk(mnt)
        assert main(_tune(endpoint, tmp_path / "s.db", mnt / "tune.html")) == 4  # a full disk: exit 4, as for the store
        err = " ".join(capsys.readouterr().err.split())
        assert "Cannot write" in err and "no file was left" in err, err
        assert sorted(p.name for p in mnt.iterdir()) == ["filler"]  # no 0-byte report, no temporary file
