"""Every example command line in every `--help` runs (issue 26: "help that lies").

The examples are collected from the commands' help texts, so an example added later runs here too.
Each runs in-process through `gpulens.cli.main.main` in a folder of its own whose default store
(`.gpulens/gpulens.db`) holds the bundled H200 session and 17 recorded runs (the run ids the
examples name); the few that serve until stopped run as a subprocess on a free port. What an example
needs beyond that (a file it names) is made first. Names of the reader's own workloads (`llama-ft`,
`chat`) become the bundled session's (`h200-demo`), so the command runs against real records rather
than stopping at "no such job". Examples that need a GPU, a server the example points at, or the
user's own script are skipped with the reason in their test id.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from testlib import wait_until

from gpulens.cli.main import main
from gpulens.data import bundled_trace
from gpulens.store import DEFAULT_STORE_PATH, Store
from gpulens.vocab import names as N

# The reader's names in the examples -> the bundled session's.
OWN_NAMES = (
    (re.compile(r"(?<=--job )llama-ft\b|(?<=train_job=)llama\b"), "h200-demo"),
    (re.compile(r"(?<=--service )chat\b|(?<=service=)chat\b"), "h200-demo"),
)
NEEDS_GPU = "needs a GPU (NVML)"


@dataclass(frozen=True)
class Case:
    skip: str = ""  # why it cannot run here
    code: int = 0  # the exit code the example documents
    serves: bool = False  # serves until Ctrl-C: run as a subprocess, wait for its address, then stop it
    before: tuple[str, ...] = ()  # example lines (without `gpulens`) run first, in the same folder
    files: dict[str, str] = field(default_factory=dict)  # files made first: name -> "bundled:<file>" or text


CONFIG_JSON = json.dumps({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                          "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000,
                          "max_position_embeddings": 4096, "torch_dtype": "bfloat16"})
CASES: dict[str, Case] = {
    "gpulens agent": Case(skip=NEEDS_GPU),
    "gpulens agent --metric-names dcgm": Case(skip=NEEDS_GPU),
    "gpulens agent --scrape http://127.0.0.1:8000/metrics --service chat": Case(skip=NEEDS_GPU + " and a serving engine on :8000"),
    "gpulens agent --listen '[::]:9464' --web-config web.yml": Case(skip=NEEDS_GPU + " and the user's web.yml"),
    "gpulens agent --backend fake:8 --interval 100ms": Case(serves=True),
    "gpulens agent --backend replay --speed 10": Case(serves=True),
    "gpulens agent --otlp http://127.0.0.1:4318/v1/metrics": Case(skip=NEEDS_GPU + " and an OpenTelemetry Collector on :4318"),
    "gpulens dashboard": Case(serves=True),
    "gpulens dashboard --store run.db --listen :9000": Case(serves=True, before=("replay --store run.db",)),
    "gpulens dashboard --listen 0.0.0.0:8642": Case(serves=True),
    "gpulens dashboard --prometheus http://127.0.0.1:9090": Case(skip="needs a Prometheus server on :9090"),
    "gpulens dashboard --listen '[::]:8642' --web-config web.yml": Case(skip="needs the user's TLS certificate (web.yml)"),
    "gpulens diagnose --prometheus http://prometheus:9090 --match '{cluster=\"a\"}' --window 6h": Case(skip="needs the Prometheus server it names"),
    "gpulens bench train --size medium --batch-size 16 --precision bf16": Case(skip=NEEDS_GPU + " (bf16, a medium model)"),
    "gpulens bench train --size large --sweep-batch": Case(skip=NEEDS_GPU + " (a large model)"),
    "gpulens alerts silence --expire 2": Case(before=("alerts silence alertname=GpuXid --for 1h", "alerts silence gpu=1 --for 1h")),
    "gpulens env diff before.json current": Case(before=("env --format json > before.json",)),
    "gpulens env diff before.json": Case(before=("env --format json > before.json",)),
    "gpulens plan --model ./config.json --workload infer --gpu l40s --prompt 2000 --new-tokens 300 --runtime vllm":
        Case(files={"config.json": CONFIG_JSON}),
    "gpulens plan --model llama-3-70b --workload infer --gpu local --gpus 4": Case(skip=NEEDS_GPU + " (tests/plan/test_local_gpu.py plans a replayed one)"),
    "gpulens plan calibrate --measurements runs.jsonl --gpu h200": Case(files={"runs.jsonl": "bundled:memory_calibration.jsonl"}),
    "gpulens replay path/to/trace --store run.db --learn 20s": Case(files={"path/to/trace": "bundled:"}),
    "gpulens replay node-a.jsonl --host node-a": Case(before=("record --backend fake:1 --interval 100ms --duration 1s --out node-a.jsonl",)),
}
for _line in ("gpulens report --prometheus http://prometheus:9090", "gpulens energy --prometheus http://prometheus:9090",
              "gpulens scale --prometheus http://prometheus:9090"):
    CASES[_line] = Case(skip="needs the Prometheus server it names")
CASES["gpulens demo --fleet 2"] = Case(serves=True, skip="" if shutil.which("prometheus") else "needs `prometheus` on PATH")
for _line in ("gpulens bench serve", "gpulens tune serve"):
    CASES[_line] = Case(skip="needs the HTTP server the example points at")
CASES["gpulens tune train"] = Case(skip="needs the user's train.py")
CASES["gpulens quant check"] = Case(skip="needs the user's model folder and evaluation (tests/evals/test_quant_check.py runs both ways on a tiny model)")


def _examples() -> list[tuple[str, str]]:
    """(command path, example line) for every example in every help text."""
    import typer.main

    from gpulens.cli.main import app

    found: list[tuple[str, str]] = []

    def walk(cmd, path: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in (cmd.help or "").splitlines():
            text = line.strip().lstrip("•* ").strip()
            quoted = re.match(r"`(gpulens [^`]*)`", text)  # "`gpulens dashboard` the local store"
            if quoted or text.startswith("gpulens "):
                example = quoted.group(1) if quoted else text
                example = " ".join(shlex.join(shlex.split(example, comments=True)).split()) if "#" in example else example
                if (" ".join(path), example) not in found:
                    found.append((" ".join(path) or "gpulens", example))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _case(example: str) -> Case:
    if example in CASES:
        return CASES[example]
    prefix = next((k for k in CASES if example.startswith(k + " ")), None)
    return CASES[prefix] if prefix and CASES[prefix].skip else Case()


EXAMPLES = _examples()


def _id(item: tuple[str, str]) -> str:
    case = _case(item[1])
    return item[1] + (f" [skipped: {case.skip}]" if case.skip else "")


@pytest.fixture(scope="module")
def seeded_store(tmp_path_factory) -> Path:
    """The bundled session and runs 1-17 of one benchmark (bench-train gpt-small), run 1 its baseline."""
    from gpulens.pipeline.ingest import import_trace
    from gpulens.runs import save_run, set_baseline

    path = tmp_path_factory.mktemp("seeded") / "gpulens.db"
    fingerprint = {"gpu": {"name": "NVIDIA H200", "driver": "570.124.06"}, "packages": {"torch": "2.5.1"}}
    with Store(path) as st:
        import_trace(bundled_trace(), st)
        for i in range(17):
            # the same spread every run: no comparison finds a change (exit code 0)
            samples = {N.TRAIN_STEP_SECONDS: [0.100 + 0.001 * ((i + k) % 7) for k in range(30)],
                       "accuracy": [0.80 + 0.01 * ((i + k) % 3) for k in range(30)]}
            save_run(st, "bench-train", "gpt-small", {"batch": 16}, {"steps": 30}, samples, fingerprint=fingerprint)
        set_baseline(st, 1)
    return path


def _argv(line: str) -> tuple[list[str], str | None]:
    """The arguments after `gpulens`, the names of the reader's workloads made the bundled session's;
    and the file a `> FILE` redirect writes. A `| program` after the command is not run."""
    for pattern, name in OWN_NAMES:
        line = pattern.sub(name, line)
    words = shlex.split(line, comments=True)
    assert words[0] == "gpulens", line
    words = words[1:]
    if "|" in words:
        words = words[: words.index("|")]
    out = None
    if ">" in words:
        i = words.index(">")
        words, out = words[:i], words[i + 1]
    return words, out


def _make_files(folder: Path, files: dict[str, str]) -> None:
    for name, what in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if what == "bundled:":
            shutil.copytree(bundled_trace(), target)
        elif what.startswith("bundled:"):
            shutil.copy(bundled_trace() / what.removeprefix("bundled:"), target)
        else:
            target.write_text(what, encoding="utf-8")


def _run_in_process(line: str, capsys) -> tuple[int, str, str]:
    argv, out = _argv(line)
    code = main(argv)
    got = capsys.readouterr()
    if out is not None:
        Path(out).write_text(got.out, encoding="utf-8")
    return code, got.out, got.err


def _serve(argv: list[str], folder: Path) -> tuple[int, str]:
    """Start a serving command on a free port, wait until it prints where it listens, then Ctrl-C it."""
    argv = [re.sub(r":\d+$", ":0", a) if i and argv[i - 1] == "--listen" else a for i, a in enumerate(argv)]
    if "--listen" not in argv:
        argv += ["--listen", "127.0.0.1:0"]
    proc = subprocess.Popen([sys.executable, "-m", "gpulens", *argv], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    # read in a thread: a command that prints nothing must fail the wait, not block the test forever
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(lambda: any("://" in line for line in list(seen)) or proc.poll() is not None, 30,
                   "the command to print its address")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(10)
        return proc.returncode, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("command", "example"), EXAMPLES, ids=[_id(e) for e in EXAMPLES])
def test_the_help_example_runs(command: str, example: str, seeded_store: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    case = _case(example)
    if case.skip:
        pytest.skip(case.skip)
    monkeypatch.chdir(tmp_path)
    for var in ("GPULENS_STORE", "GPULENS_BACKEND", "GPULENS_METRIC_NAMES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    DEFAULT_STORE_PATH.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(seeded_store, DEFAULT_STORE_PATH)
    _make_files(tmp_path, case.files)
    for first in case.before:
        code, _out, err = _run_in_process("gpulens " + first, capsys)
        assert code == 0, (first, err)
    if case.serves:
        code, output = _serve(_argv(example)[0], tmp_path)
        # stopped by Ctrl-C, as the help says: 0, 130, or uvicorn's re-raised SIGINT (a shell shows 130 too)
        assert code in (0, 130, -signal.SIGINT), output
    else:
        code, out, err = _run_in_process(example, capsys)
        output = out + err
        assert code == case.code, (example, output)
    assert "Traceback" not in output, output
    assert "malformed" not in output, output  # it was given what it reads


def test_every_help_with_examples_is_collected() -> None:
    """The collector sees the examples of groups and subcommands alike (a parser that missed the
    backticked lines of `dashboard --help` ran none of them)."""
    commands = {c for c, _ in EXAMPLES}
    assert {"agent", "dashboard", "diagnose", "replay", "compare", "env diff", "alerts silence", "plan"} <= commands
    assert len(EXAMPLES) >= 60
