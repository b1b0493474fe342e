"""Every wait is bounded (issue 27, item 1): the hangs found by the hostile-input sweep, as real CLI runs.

- agent, top and replay over a recording with a far-away line or a day-long gap: running (a
  condition, not a sleep), then SIGTERM / SIGINT, and the process is gone within 5 s; with
  `--duration` or `--max-gap` they finish on their own;
- inputs that used to hang (arrival times of 1e300 or Infinity, a length file holding 1e30, a rate
  of 1e300, a billion users, a 1 ms step over 100 years, a FIFO as the store, /dev/urandom as a
  trace): each ends within 30 s with exit 2 and one sentence, never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from testlib import free_port, wait_http, wait_until

from gpulens.data import bundled_trace
from gpulens.vocab.gpu import GPU_TEMPERATURE_CELSIUS

CLI = [sys.executable, "-m", "gpulens.cli.main"]
ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "400"}
# A stop that is not honoured waits out the 60 s max gap (or a day): 20 s to exit after the signal
# tells that apart and leaves a loaded runner room for a Python process's shutdown; a command that
# should end at once gets 60 s, most of it for the interpreter's start-up on a busy machine.
EXIT_WITHIN_SECONDS = 20.0
CASE_TIMEOUT_SECONDS = 60.0
DAY = 86400.0
pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="waits for open files through /proc")


def _h200_lines(n: int) -> list[dict]:
    with (bundled_trace() / "telemetry.jsonl").open() as f:
        return [json.loads(next(f)) for _ in range(n)]


MARK_CELSIUS = 93  # the temperature of the one frame the tests wait to see (every other frame reads 40)


def _trace(path: Path, times: list[float], mark: int) -> Path:
    """An H200-format trace with these sample times (the readings of the bundled session's first
    lines), at 40 °C but for frame `mark`, at MARK_CELSIUS: seeing it means the replay got there."""
    lines = _h200_lines(len(times))
    path.write_text("".join(json.dumps({**d, "t": t, "temp_c": MARK_CELSIUS if i == mark else 40}) + "\n"
                            for i, (d, t) in enumerate(zip(lines, times, strict=True))))
    return path


def _t0() -> float:
    return _h200_lines(1)[0]["t"]


def gap_trace(tmp: Path, after: int = 200) -> Path:
    """Five frames, then a day later `after` more: a lasting jump, played as --max-gap (60 s by default).
    The frames after it keep the trace open while the replay waits (what the tests wait for)."""
    t0 = _t0()
    return _trace(tmp / "gap.jsonl", [t0 + 0.1 * i for i in range(5)] + [t0 + DAY + 0.1 * i for i in range(after)], mark=4)


def far_line_trace(tmp: Path, far_t: float, name: str) -> Path:
    """Ten frames at 10 Hz with one line dated `far_t` among them (line 7), marked the frame before it."""
    t0 = _t0()
    times = [t0 + 0.1 * i for i in range(10)]
    times.insert(6, far_t)
    return _trace(tmp / name, times, mark=5)


YEAR_2199 = 7_258_000_000.0  # inside the store's 1970..2200, outside what a recording may hold
YEAR_2099 = 4_090_000_000.0  # a plausible date, but a century from its neighbours


def _holds_open(pid: int, path: Path) -> bool:
    want = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                return True
        except OSError:
            continue
    return False


def _ends_within(proc: subprocess.Popen, seconds: float) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running {seconds:g} s after the signal: {(out + err)[-1500:]}") from None
    return proc.returncode, out + err


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or ENV)


def _shows_mark(body: bytes) -> bool:
    """/metrics reads the marked frame's temperature: the replay is at the frame before the wait."""
    for line in body.decode().splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name.split("{")[0].endswith(GPU_TEMPERATURE_CELSIUS) and value and float(value) == MARK_CELSIUS:
            return True
    return False


def _wait_for_mark(proc: subprocess.Popen, port: int) -> None:
    wait_http(f"http://127.0.0.1:{port}/metrics", proc, until=_shows_mark, interval=0.05, what="the replay's frame before its wait")


# ------------------------------------------------------------------ stop signals end every wait
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_agent_in_a_day_long_replay_gap_stops_on_a_signal(tmp_path, sig):
    port = free_port()
    proc = _start(["agent", "--backend", f"replay:{gap_trace(tmp_path)}", "--speed", "1", "--store", str(tmp_path / "a.db"),
                   "--listen", f"127.0.0.1:{port}"])
    try:
        _wait_for_mark(proc, port)
    finally:
        proc.send_signal(sig)
    rc, out = _ends_within(proc, EXIT_WITHIN_SECONDS)
    assert rc == 0 and "stopped after" in out and "Traceback" not in out, out


def test_agent_looping_over_a_line_dated_2199_stops_on_sigterm(tmp_path):
    trace = far_line_trace(tmp_path, YEAR_2199, "y2199.jsonl")
    port = free_port()
    proc = _start(["agent", "--backend", f"replay:{trace}", "--loop", "--speed", "1", "--store", str(tmp_path / "a.db"),
                   "--listen", f"127.0.0.1:{port}"])
    try:
        _wait_for_mark(proc, port)
    finally:
        proc.send_signal(signal.SIGTERM)
    rc, out = _ends_within(proc, EXIT_WITHIN_SECONDS)
    assert rc == 0 and "stopped after" in out, out


def test_agent_duration_ends_a_day_long_replay_gap(tmp_path):
    # 5 s: the five frames before the gap take 0.4 s (1 s left a loaded machine 0.6 s to play them),
    # and the gap plays as the 60 s max gap, which the duration must cut
    r = subprocess.run([*CLI, "agent", "--backend", f"replay:{gap_trace(tmp_path)}", "--speed", "1", "--duration", "5s",
                        "--store", str(tmp_path / "a.db"), "--listen", "off"],
                       capture_output=True, text=True, env=ENV, timeout=CASE_TIMEOUT_SECONDS)
    assert r.returncode == 0 and "stopped after 5 samples" in r.stderr, r.stderr


def test_top_in_a_day_long_replay_gap_stops_on_sigterm(tmp_path):
    # TTY_COMPATIBLE: rich draws the live view into the pipe, so the test sees each frame drawn
    proc = _start(["top", "--backend", f"replay:{gap_trace(tmp_path)}", "--speed", "1", "--interval", "10ms"],
                  env={**ENV, "TTY_COMPATIBLE": "1"})
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: proc.stdout.read(256), "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: f"{MARK_CELSIUS} °C" in "".join(seen) or proc.poll() is not None, what="top to draw the frame before the gap")
    finally:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=EXIT_WITHIN_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"top still runs {EXIT_WITHIN_SECONDS:g} s after SIGTERM") from None
    reader.join(timeout=EXIT_WITHIN_SECONDS)
    err = proc.stderr.read()
    assert proc.returncode == 0 and f"{MARK_CELSIUS} °C" in "".join(seen) and "Traceback" not in err, err


def test_top_duration_ends_a_day_long_replay_gap(tmp_path):
    r = subprocess.run([*CLI, "top", "--backend", f"replay:{gap_trace(tmp_path)}", "--speed", "1", "--duration", "1s"],
                       capture_output=True, text=True, env=ENV, timeout=CASE_TIMEOUT_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_replay_in_a_day_long_gap_stops_on_sigterm_and_keeps_what_it_committed(tmp_path):
    trace = gap_trace(tmp_path)
    proc = _start(["replay", str(trace), "--speed", "1", "--store", str(tmp_path / "r.db")])
    wait_until(lambda: _holds_open(proc.pid, trace) or proc.poll() is not None, what="replay to open the trace")
    proc.send_signal(signal.SIGTERM)
    rc, out = _ends_within(proc, EXIT_WITHIN_SECONDS)
    assert rc == 2 and "stopped before its end; what it stored is kept" in out and "Traceback" not in out, out


@pytest.mark.parametrize(("far_t", "why"), [(YEAR_2199, "outside 1970..2100"), (YEAR_2099, "more than the max gap of 60 s")],
                         ids=["dated 2199", "dated 2099"])
def test_replay_at_recorded_pace_skips_a_far_line_and_counts_it(tmp_path, far_t, why):
    trace = far_line_trace(tmp_path, far_t, "far.jsonl")
    r = subprocess.run([*CLI, "replay", str(trace), "--speed", "1", "--store", str(tmp_path / "r.db")],
                       capture_output=True, text=True, env=ENV, timeout=CASE_TIMEOUT_SECONDS)
    assert r.returncode == 0, r.stderr
    assert "imported 10 GPU samples" in r.stdout and "skipped 1 malformed line" in r.stderr and "line 7:" in r.stderr, r.stdout + r.stderr
    assert why in r.stderr, r.stderr


def test_replay_plays_a_long_gap_as_max_gap(tmp_path):
    r = subprocess.run([*CLI, "replay", str(gap_trace(tmp_path, after=5)), "--speed", "1", "--max-gap", "1s", "--store", str(tmp_path / "r.db")],
                       capture_output=True, text=True, env=ENV, timeout=CASE_TIMEOUT_SECONDS)
    assert r.returncode == 0, r.stderr
    # every frame kept, with its recorded time: the day shows in the span, not in the wait
    assert "imported 10 GPU samples" in r.stdout and "over 24.0 h" in r.stdout and "skipped" not in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("cmd", ["agent", "top", "replay"])
def test_max_gap_is_in_the_help_of_every_replaying_command(cmd):
    from typer.testing import CliRunner

    from gpulens.cli.main import app

    r = CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--max-gap" in r.output and "longest recorded gap" in r.output, r.output


# ------------------------------------------------------------------ inputs that used to hang: exit 2, one sentence
class _Ok(BaseHTTPRequestHandler):
    """A real server that answers everything at once, so a run that is not refused would really run."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def ok_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _mooncake(path: Path, second_timestamp: str) -> str:
    return _write(path, '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                        f'{{"timestamp": {second_timestamp}, "input_length": 10, "output_length": 5}}\n')


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


# name -> (args builder, words the sentence names)
HANG_CASES = {
    "arrival at 1e300": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store",
                                           "--replay-arrivals", _mooncake(t / "m.jsonl", "1e300")], "arrival time"),
    "arrival at Infinity": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store",
                                              "--replay-arrivals", _mooncake(t / "m.jsonl", "Infinity")], "not a finite number"),
    "arrivals a century apart": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store",
                                                   "--replay-arrivals", _mooncake(t / "m.jsonl", "3155760000000")], "span"),
    "lengths file with 1e30": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/v1/completions", "--no-store", "--rate", "1",
                                                 "--input-tokens", "file:" + _write(t / "l.txt", "100\n1e30\n")], "1e+30"),
    "lengths file with inf": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/v1/completions", "--no-store", "--rate", "1",
                                                "--input-tokens", "file:" + _write(t / "l.txt", "100\ninf\n")], "inf"),
    "input tokens 10**12": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/v1/completions", "--no-store", "--rate", "1",
                                              "--input-tokens", "1000000000000"], "tokens"),
    "lengths file /dev/zero": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/v1/completions", "--no-store", "--rate", "1",
                                                 "--input-tokens", "file:/dev/zero"], "character device"),
    "rate 1e300": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store", "--rate", "1e300"], "--rate"),
    "rate inf": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store", "--rate", "inf"], "--rate"),
    "a billion users": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store",
                                          "--concurrency", "1000000000"], "--concurrency"),
    "a million load processes": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store", "--rate", "10",
                                                   "--workers", "1000000"], "--workers"),
    "sweep limit 1e300": (lambda t, u, s: ["bench", "serve", "--url", f"{u}/health", "--no-store", "--sweep", "--rate", "1",
                                            "--slo", "p99_latency<=1s", "--max-rate", "1e300"], "--max-rate"),
    "scale 1ms over 100 years": (lambda t, u, s: ["scale", "--store", s, "--step", "1ms", "--after", "36500d"], "evaluations"),
    "FIFO as the agent's store": (lambda t, u, s: ["agent", "--backend", "fake:1", "--duration", "1s", "--listen", "off",
                                                    "--store", _fifo(t / "fifo.db")], "FIFO"),
    "FIFO as the store to read": (lambda t, u, s: ["query", "gpu_up", "--store", _fifo(t / "fifo.db")], "FIFO"),
    "FIFO as a trace": (lambda t, u, s: ["replay", _fifo(t / "fifo.jsonl"), "--store", str(t / "r.db")], "FIFO"),
    "/dev/urandom as a trace": (lambda t, u, s: ["replay", "/dev/urandom", "--store", str(t / "r.db")], "character device"),
    "/dev/zero as the agent's trace": (lambda t, u, s: ["agent", "--backend", "replay:/dev/zero", "--duration", "1s",
                                                         "--listen", "off", "--store", str(t / "a.db")], "character device"),
}


@pytest.mark.parametrize("case", sorted(HANG_CASES))
def test_input_that_used_to_hang_is_one_sentence_and_exit_2(case, tmp_path, ok_server, replayed_store):
    build, named = HANG_CASES[case]
    store = tmp_path / "s.db"
    shutil.copy(replayed_store, store)
    r = subprocess.run([*CLI, *build(tmp_path, ok_server, str(store))], capture_output=True, text=True, env=ENV,
                       timeout=CASE_TIMEOUT_SECONDS)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out, out
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    # one sentence of what went wrong (and, on the line after it, what to do)
    assert lines and lines[0].startswith("error: ") and lines[0].endswith(".") and len(lines) <= 2, r.stderr
    assert named in lines[0], r.stderr
