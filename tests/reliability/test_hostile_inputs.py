"""The hostile-input table of issue 27 (item 5): values and files built to hurt, every one either
refused with one sentence or handled: never a traceback, never a hang (each case is bounded at 30 s).

The table is generated from classes, so a new option or reader is attacked without anyone listing it:
- every int and float option of every command (found in the CLI's own command tree) × hostile
  numbers (nan, inf, 1e400, 2**63, 5,000 digits...): exit 2 and the option named;
- every reader of untrusted files × hostile files (nesting 200,000 deep, a 5,000-digit integer,
  invalid UTF-8, NaN / Infinity / 1e400, a YAML alias bomb, NUL bytes...): exit in the reader's set;
- rule files with a hostile expression or template, SLOs with a non-finite bound.

Commands run in this process (`gpulens.cli.main.main`) with captured output: ~1,000 subprocesses
would take minutes on CI's two cores.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path

import pytest
from hostile_files import HOSTILE_FILES

from gpulens.cli.main import main

DEAD_URL = "http://127.0.0.1:9/v1/completions"  # the discard port: nothing listens, a connection is refused at once
TIMEOUT = pytest.mark.timeout(30)

# ------------------------------------------------------------------ the runner


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one command run in this process; an exception that escapes
    main() is what the suite exists to catch, so it becomes the output."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)  # a logged traceback counts as one
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
    except BaseException as e:  # noqa: BLE001 - anything main() lets out is a finding
        import traceback

        return -1, out.getvalue(), err.getvalue() + "Traceback (escaped main)\n" + "".join(traceback.format_exception(e))
    finally:
        root.removeHandler(handler)
    return rc, out.getvalue(), err.getvalue()


def assert_one_sentence(rc: int, out: str, err: str, allowed: set[int], names: tuple[str, ...] = ()) -> None:
    text = out + err
    assert "Traceback" not in text, text[-3000:]
    assert rc in allowed, (rc, text[-2000:])
    if rc == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[0].startswith("error: "), err[-2000:]
        assert len(lines) <= 2 and all(x.startswith("→") for x in lines[1:]), err[-2000:]  # the sentence, one hint
        assert len(err) < 4000, f"{len(err)} characters of error"  # a 5,000-digit value is not echoed whole
        for name in names:
            assert name in err, err


@pytest.fixture(scope="module")
def env(tmp_path_factory, replayed_store):
    """A writable copy of the replayed store, a folder for files, a wide terminal."""
    base = tmp_path_factory.mktemp("hostile")
    db = base / "store.db"
    shutil.copy(replayed_store, db)
    mp = pytest.MonkeyPatch()
    mp.setenv("COLUMNS", "200")
    mp.setenv("NO_COLOR", "1")
    mp.setenv("GPULENS_PLAN_CONFIG", str(base / "no-plan.yaml"))
    mp.setenv("XDG_CONFIG_HOME", str(base / "config"))  # plan calibrate writes its file there
    yield {"db": db, "dir": base}
    mp.undo()


# ------------------------------------------------------------------ class 1: hostile numbers × options × commands

# The arguments each command needs besides the option under attack, so that only that option can be
# refused. Every command with a number option must be here (test_every_number_option_is_attacked).
BASE: dict[str, list[str]] = {
    "alerts list": ["alerts", "list", "--store", "{db}"],
    "alerts silence": ["alerts", "silence", "--store", "{db}"],
    "bench serve": ["bench", "serve", "--url", DEAD_URL, "--no-store", "--duration", "1s"],
    "bench train": ["bench", "train", "--store", "{dir}/train.db"],
    "compare": ["compare", "1", "--store", "{db}"],
    "demo": ["demo", "--store", "{dir}/demo.db"],  # every number refused before anything starts (--fleet N too)
    "eval compare": ["eval", "compare", "{dir}/a.jsonl", "{dir}/a.jsonl", "--metric", "acc"],
    "plan": ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"],
    "plan compare": ["plan", "compare", "--model", "llama-3-8b"],
    "quant check": ["quant", "check", "--model", "{dir}", "--to", "int8", "--task", "x"],
    "query": ["query", "gpu_up", "--store", "{db}"],
    "runs list": ["runs", "list", "--store", "{db}"],
    "scale": ["scale", "--store", "{db}"],
    "tune serve": ["tune", "serve", "--url", DEAD_URL],
    "tune train": ["tune", "train"],
}

HOSTILE_INTS = ["nan", "inf", "1e400", "1e20", "9223372036854775808", "-9223372036854775809", "1" * 5000, "0x10", "", "1.5"]
HOSTILE_FLOATS = ["nan", "-nan", "inf", "-inf", "+Infinity", "NaN", "1e400", "-1e400", "9" * 400, ""]


def number_options() -> list[tuple[str, str, str]]:
    """(command path, flag, "int" or "float") for every number option in the CLI's command tree."""
    import typer.main

    from gpulens.cli.main import app

    found: list[tuple[str, str, str]] = []

    def walk(cmd, path: list[str]) -> None:
        for p in cmd.params:
            kind = _kind(p)
            if kind and p.opts and p.opts[0].startswith("--"):
                found.append((" ".join(path), p.opts[0], kind))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _kind(param) -> str | None:
    """int / float for a click parameter, whether typer describes it by annotation (0.2x) or type."""
    ann = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if ann in (int, float):
        return ann.__name__
    name = type(getattr(param, "type", None)).__name__
    return {"IntParamType": "int", "IntRange": "int", "FloatParamType": "float", "FloatRange": "float"}.get(name)


NUMBER_OPTIONS = number_options()
NUMBER_CASES = [(cmd, flag, value) for cmd, flag, kind in NUMBER_OPTIONS
                for value in (HOSTILE_INTS if kind == "int" else HOSTILE_FLOATS)]


def _fill(args: list[str], env) -> list[str]:
    return [a.format(db=env["db"], dir=env["dir"]) for a in args]


def test_every_number_option_is_attacked():
    missing = sorted({cmd for cmd, _, _ in NUMBER_OPTIONS} - set(BASE))
    assert not missing, f"give these commands a BASE entry: {missing}"
    assert len(NUMBER_OPTIONS) >= 70


@TIMEOUT
@pytest.mark.parametrize(("cmd", "flag", "value"), NUMBER_CASES,
                         ids=[f"{c} {f} {v[:12]}{'…' if len(v) > 12 else ''}" for c, f, v in NUMBER_CASES])
def test_hostile_number_is_refused_naming_its_option(env, cmd, flag, value):
    rc, out, err = run_cli([*_fill(BASE[cmd], env), flag, value])
    assert_one_sentence(rc, out, err, {2}, names=(flag,))


# Counts below zero: refused by every count option (a seed may be any integer).
SIGNED = {"--seed"}
NEGATIVE_CASES = [(cmd, flag) for cmd, flag, kind in NUMBER_OPTIONS if kind == "int" and flag not in SIGNED]
RUNNABLE = {"bench serve": ["--rate", "1"], "tune train": ["--", "true"]}  # so that only the count can be wrong


@TIMEOUT
@pytest.mark.parametrize(("cmd", "flag"), NEGATIVE_CASES, ids=[f"{c} {f} -1" for c, f in NEGATIVE_CASES])
def test_a_negative_count_is_refused(env, cmd, flag):
    rc, out, err = run_cli([*_fill(BASE[cmd], env), flag, "-1", *RUNNABLE.get(cmd, [])])
    assert_one_sentence(rc, out, err, {2})


# ------------------------------------------------------------------ class 1b: hostile ids where a run is named

HOSTILE_IDS = ["9223372036854775808", "#9223372036854775808", "1" * 5000, "\u0661\u0662", "0", "1e20", "nan", "  ", "latest\u202e", "-0"]
ID_COMMANDS = {
    "runs show": ["runs", "show", "{id}", "--store", "{db}"],
    "runs baseline": ["runs", "baseline", "{id}", "--store", "{db}"],
    "compare A": ["compare", "{id}", "--store", "{db}"],
    "compare 1 B": ["compare", "1", "{id}", "--store", "{db}"],
    "env diff": ["env", "diff", "{id}", "--store", "{db}"],
}
ID_CASES = [(c, i) for c in ID_COMMANDS for i in HOSTILE_IDS]


@TIMEOUT
@pytest.mark.parametrize(("cmd", "run_id"), ID_CASES, ids=[f"{c} {i[:12]!r}" for c, i in ID_CASES])
def test_hostile_run_id_is_no_run(env, cmd, run_id):
    rc, out, err = run_cli([a.replace("{id}", run_id).format(db=env["db"]) for a in ID_COMMANDS[cmd]])
    assert_one_sentence(rc, out, err, {2})


# ------------------------------------------------------------------ class 1c: paths the file system cannot hold

HOSTILE_PATHS = ["x" * 5000, "d/" * 3000 + "x", "/tmp/" + "y" * 300 + ".db"]
PATH_COMMANDS = {
    "alerts list --store": ["alerts", "list", "--store", "{p}"],
    "runs list --store": ["runs", "list", "--store", "{p}"],
    "query --store": ["query", "gpu_up", "--store", "{p}"],
    "diagnose --store": ["diagnose", "--store", "{p}"],
    "baseline show --store": ["baseline", "show", "--store", "{p}"],
    "energy --store": ["energy", "--store", "{p}"],
    "replay TRACE": ["replay", "{p}", "--store", "{dir}/long.db"],
    "replay --store": ["replay", "--store", "{p}"],
    "env diff FILE": ["env", "diff", "{p}", "--store", "{db}"],
    "eval compare FILE": ["eval", "compare", "{p}", "{p}", "--metric", "acc"],
    "alerts export --rules": ["alerts", "export", "--rules", "{p}"],
    "bench serve --dataset": ["bench", "serve", "--url", DEAD_URL, "--dataset", "{p}", "--no-store", "--rate", "1"],
    "plan --model": ["plan", "--model", "{p}.json", "--gpu", "h100-sxm"],
}
PATH_CASES = [(c, i) for c in PATH_COMMANDS for i in range(len(HOSTILE_PATHS))]


@TIMEOUT
@pytest.mark.parametrize(("cmd", "which"), PATH_CASES, ids=[f"{c} path{i}" for c, i in PATH_CASES])
def test_a_path_too_long_is_one_sentence(env, cmd, which):
    path = HOSTILE_PATHS[which]
    rc, out, err = run_cli([a.replace("{p}", path).format(db=env["db"], dir=env["dir"]) for a in PATH_COMMANDS[cmd]])
    assert_one_sentence(rc, out, err, {2})


# ------------------------------------------------------------------ class 2: hostile files × readers

# reader: (argv with {f} for the file, the exit codes it may give). A reader that skips bad lines
# (a recording) may finish (0); one that reads a valid-looking file may reach the dead URL (3).
READERS: dict[str, tuple[list[str], set[int]]] = {
    "recording (replay)": (["replay", "{f}", "--store", "{dir}/replay-{n}.db"], {0, 2}),
    "rule file (alerts export)": (["alerts", "export", "--rules", "{f}", "--out", "{dir}/rules-{n}.yaml"], {0, 2}),
    "rule file (replay --rules)": (["replay", "--rules", "{f}", "--store", "{dir}/rr-{n}.db"], {0, 2}),  # empty: no rules
    "arrivals (bench serve --replay-arrivals)": (["bench", "serve", "--url", DEAD_URL, "--replay-arrivals", "{f}", "--no-store"], {2, 3}),
    "prompt dataset (bench serve --dataset)": (["bench", "serve", "--url", DEAD_URL, "--dataset", "{f}", "--no-store",
                                                "--requests", "1", "--rate", "1"], {2, 3}),
    "model config.json (plan --model)": (["plan", "--model", "{f}.json", "--workload", "train", "--gpu", "h100-sxm",
                                          "--batch", "1", "--seq", "1024"], {2}),
    "measurements (plan calibrate)": (["plan", "calibrate", "--measurements", "{f}", "--gpu", "h200"], {2}),
    "eval samples (eval compare)": (["eval", "compare", "{f}", "{f}", "--metric", "acc"], {2}),
    "fingerprint (env diff)": (["env", "diff", "{f}", "--store", "{db}"], {2}),
}
FILE_CASES = [(reader, name) for reader in READERS for name in HOSTILE_FILES]


def _file(env, name: str, suffix: str = "") -> Path:
    p = env["dir"] / f"file-{abs(hash(name))}{suffix}"
    p.write_bytes(HOSTILE_FILES[name])
    return p


@TIMEOUT
@pytest.mark.parametrize(("reader", "name"), FILE_CASES, ids=[f"{r}: {n}" for r, n in FILE_CASES])
def test_hostile_file_is_refused_or_read(env, reader, name):
    argv, allowed = READERS[reader]
    f = _file(env, name)
    if "{f}.json" in argv:  # the model reader takes a path ending .json as a config
        f.rename(f.with_suffix(".json"))
        f = f.with_suffix("")
    n = abs(hash((reader, name)))
    rc, out, err = run_cli([a.format(f=f, dir=env["dir"], db=env["db"], n=n) for a in argv])
    assert_one_sentence(rc, out, err, allowed)


@TIMEOUT
@pytest.mark.parametrize("reader", ["recording (replay)", "rule file (alerts export)", "prompt dataset (bench serve --dataset)",
                                    "eval samples (eval compare)"])
@pytest.mark.parametrize("kind", ["a folder", "a missing path", "/dev/null"])
def test_a_path_that_is_not_a_file(env, reader, kind):
    argv, allowed = READERS[reader]
    f = {"a folder": env["dir"], "a missing path": env["dir"] / "nowhere" / "x.jsonl", "/dev/null": Path("/dev/null")}[kind]
    rc, out, err = run_cli([a.format(f=f, dir=env["dir"], db=env["db"], n=kind.replace(" ", "-").strip("/")) for a in argv])
    assert_one_sentence(rc, out, err, allowed)


# Readers without a quick command (the web config starts a server once it is valid; the plan config
# is found through the environment): called directly, with the same files.
def _web_config(path: Path):
    from gpulens.webconfig import load_web_config

    return load_web_config(path)


def _plan_config(path: Path):
    from gpulens.plan.catalog import load_user_config

    return load_user_config(path)


def _nvml_probe(path: Path):
    from gpulens.gpu.replay import _probe_info

    (path.parent / "nvml_probe.json").write_bytes(path.read_bytes())
    return _probe_info(path.parent)  # optional facts: a bad probe is ignored, never raised


FUNCTION_READERS = {"web config": _web_config, "plan config": _plan_config, "nvml probe": _nvml_probe}
FUNCTION_CASES = [(reader, name) for reader in FUNCTION_READERS for name in HOSTILE_FILES]


@TIMEOUT
@pytest.mark.parametrize(("reader", "name"), FUNCTION_CASES, ids=[f"{r}: {n}" for r, n in FUNCTION_CASES])
def test_hostile_file_read_directly(env, tmp_path, reader, name):
    from gpulens.errors import GpulensError

    f = tmp_path / "input"
    f.write_bytes(HOSTILE_FILES[name])
    try:
        FUNCTION_READERS[reader](f)
    except GpulensError as e:
        assert e.exit_code == 2 and str(e).strip() and "\n" not in e.message and len(str(e)) < 1000, str(e)


# ------------------------------------------------------------------ class 3: rule expressions and templates

RULE = "rules:\n- name: hostile\n  expr: {expr}\n  summary: {summary}\n"
HOSTILE_RULES: dict[str, tuple[str, str]] = {
    "expr nested 5000 deep in parentheses": ("'" + "(" * 5000 + "gpu_up" + ")" * 5000 + "'", "x"),
    "expr nested 1000 deep (under the length cap)": ("'" + "(" * 1000 + "gpu_up" + ")" * 1000 + "'", "x"),
    "expr with 5000 negations": ("'" + "-" * 5000 + "gpu_up'", "x"),
    "expr with 1500 negations": ("'" + "-" * 1500 + "gpu_up'", "x"),
    "expr chaining 5000 additions": ("'" + " + ".join(["gpu_up"] * 5000) + "'", "x"),
    "expr chaining 1000 additions": ("'" + "+".join(["1"] * 1000) + " > gpu_up'", "x"),
    "expr with 1e400": ("'gpu_up > 1e400'", "x"),
    "expr of 100000 characters": ("'gpu_up" + " " * 100_000 + "'", "x"),
    "summary %.3000000000f": ("'gpu_up == 0'", "'{{ printf \"%.3000000000f\" $value }}'"),
    "summary %.99f": ("'gpu_up == 0'", "'{{ printf \"%.99f\" $value }}'"),
    "summary %.999999999999999999999f": ("'gpu_up == 0'", "'{{ printf \"%.999999999999999999999f\" $value }}'"),
    "summary of 1 MB": ("'gpu_up == 0'", "'" + "x" * 1_000_000 + "'"),
    "summary an alias-built list": ("'gpu_up == 0'", "[1, 2]"),
    "summary an unknown template": ("'gpu_up == 0'", "'{{ .Value }}'"),
    "summary with a printf of %s": ("'gpu_up == 0'", "'{{ printf \"%s\" $value }}'"),
    # an unclosed action: promtool refuses the whole exported file ("unclosed action")
    "summary with an unclosed {{": ("'gpu_up == 0'", "'hot {{'"),
    "summary with an unclosed {{ after a template": ("'gpu_up == 0'", "'{{ $value }} and {{ $labels.gpu'"),
}


@TIMEOUT
@pytest.mark.parametrize("name", sorted(HOSTILE_RULES))
def test_hostile_rule_is_refused_at_load(env, name):
    expr, summary = HOSTILE_RULES[name]
    f = env["dir"] / f"rule-{abs(hash(name))}.yaml"
    f.write_text(RULE.format(expr=expr, summary=summary), encoding="utf-8")
    rc, out, err = run_cli(["alerts", "export", "--rules", f, "--out", env["dir"] / "exported.yaml"])
    assert_one_sentence(rc, out, err, {2}, names=(str(f),))


def test_a_bounded_template_renders_within_its_bound():
    """What passes the load check renders small, whatever the value (a rule built in code included)."""
    from gpulens.alerts.rules import MAX_RENDERED_CHARS, parse_rules, render_template

    rules = parse_rules(RULE.format(expr="'gpu_up == 0'", summary="'{{ printf \"%.12f\" $value }} on {{ $labels.gpu }}'"))
    for value in (1.0, 1e300, float("inf"), float("nan"), -0.0):
        text = render_template(rules.rules[0].summary, {"gpu": "g" * 100_000}, value)
        assert len(text) <= MAX_RENDERED_CHARS
    assert render_template('{{ printf "%.3000000000f" $value }}', {}, 1.0) == f"{1.0:.12f}"


# ------------------------------------------------------------------ class 4: objectives (strings that hold numbers)

HOSTILE_SLOS = ["p99<inf", "p99_latency<=nan", "p99_latency<=" + "9" * 400, "error_rate<=1e400%", "p99_latency<=-1ms",
                "p99_latency<=" + "1" * 5000 + "ms", "p1e400_latency<=1s", "p99_latency<=0"]
SLO_COMMANDS = {
    "bench serve": ["bench", "serve", "--url", DEAD_URL, "--no-store", "--rate", "1", "--duration", "1s", "--slo"],
    "diagnose": ["diagnose", "--store", "{db}", "--slo"],
}
SLO_CASES = [(c, s) for c in SLO_COMMANDS for s in HOSTILE_SLOS]


@TIMEOUT
@pytest.mark.parametrize(("cmd", "slo"), SLO_CASES, ids=[f"{c} {s[:24]}" for c, s in SLO_CASES])
def test_hostile_objective_is_refused(env, cmd, slo):
    rc, out, err = run_cli([*_fill(SLO_COMMANDS[cmd], env), slo])
    assert_one_sentence(rc, out, err, {2})


def test_the_table_holds_at_least_700_cases():
    n = len(NUMBER_CASES) + len(NEGATIVE_CASES) + len(ID_CASES) + len(PATH_CASES) + len(FILE_CASES) + 4 * 3 + len(FUNCTION_CASES) + len(HOSTILE_RULES) + len(SLO_CASES)
    assert n >= 700, n
