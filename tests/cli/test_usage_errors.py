"""Usage errors (what click/typer reject before a command runs): exit 2, one sentence on stderr, no traceback,
from both entry points. This file also runs in .ci/run's newest-versions job, so a new typer that changes its
exception classes fails here first."""

from __future__ import annotations

import pytest
from clirun import ENTRY_POINTS, GPULENS_SCRIPT, run_gpulens

from gpulens.cli import usage_errors

# (arguments, words the message must contain)
USAGE_ERRORS = [
    # unknown command, at the top and in a sub-command group, with a suggestion
    (["plna"], ["no such command 'plna'", "did you mean", "plan"]),
    (["alerts", "lst"], ["no such command 'lst'", "did you mean", "list"]),
    (["baseline", "shwo"], ["no such command 'shwo'", "show"]),
    # unknown option, with a suggestion
    (["diagnose", "--stor", "demo.db"], ["no such option --stor", "gpulens diagnose", "did you mean", "--store"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9/", "--concurency", "2"], ["--concurency", "--concurrency"]),
    (["runs", "list", "--bogus-flag"], ["no such option --bogus-flag"]),
    # wrong type
    (["plan", "--batch", "abc"], ["--batch", "integer"]),
    (["plan", "compare", "--gpus", "x"], ["--gpus", "integer"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9/", "--rate", "fast"], ["--rate"]),
    # out of range
    (["alerts", "list", "--limit", "0"], ["--limit"]),
    # missing argument / option value
    (["query"], ["missing argument"]),
    (["env", "diff"], ["missing argument"]),
    (["bench", "serve", "--url"], ["--url", "requires an argument", "gpulens bench serve --help"]),
    # bad choice
    (["bench", "serve", "--url", "http://127.0.0.1:9/", "--arrival", "bogus"], ["--arrival", "bogus", "poisson"]),
    (["bench", "serve", "--url", "http://127.0.0.1:9/", "--format", "xml"], ["--format", "xml"]),
]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize(("args", "needles"), USAGE_ERRORS, ids=[" ".join(args) for args, _ in USAGE_ERRORS])
def test_usage_error_is_one_sentence_and_exit_2(entry, args, needles):
    if entry == "script" and not GPULENS_SCRIPT.exists():
        pytest.skip(f"no gpulens script beside {GPULENS_SCRIPT.parent} (package not installed)")
    r = run_gpulens(*args, entry=entry)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stdout == "", r.stdout  # errors go to stderr only
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: "), r.stderr
    assert len(lines) == 2 and lines[1].startswith("→ Run `gpulens"), r.stderr  # the sentence and the --help hint
    text = r.stderr.lower()
    for needle in needles:
        assert needle.lower() in text, r.stderr
    assert "\x1b[" not in r.stderr  # a pipe gets plain text


def test_no_arguments_shows_the_help_without_a_traceback():
    r = run_gpulens()
    assert "Traceback" not in r.stderr + r.stdout
    assert "Usage" in r.stdout + r.stderr
    assert r.returncode in (0, 2)  # click < 8.2 exits 0 for help-without-arguments, newer click 2


def test_click_and_vendored_click_errors_are_both_recognised():
    """typer < 0.2x raises click's exceptions, newer typer its vendored copies: both must be caught."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in usage_errors.CLICK_ERRORS}
    try:
        import click  # noqa: F401
    except ImportError:
        pass
    else:
        assert "click.exceptions.ClickException" in names
    try:
        import typer._click.exceptions  # noqa: F401
    except ImportError:
        pass
    else:
        assert "typer._click.exceptions.ClickException" in names


def test_describe_suggests_for_click_s_own_no_such_option():
    click = pytest.importorskip("click")
    err = click.exceptions.NoSuchOption("--stor", possibilities=["--store"])
    problem = usage_errors.describe(err)
    assert problem.exit_code == 2
    assert problem.message == "No such option --stor for `gpulens`. Did you mean '--store'?"


def test_describe_suggests_a_command_when_click_does_not():
    """Older typer says only "No such command 'plna'."; the suggestion then comes from the group's commands."""
    import typer.main

    from gpulens.cli.main import app

    group = typer.main.get_command(app)
    ctx = group.make_context("gpulens", ["plan", "--help"], resilient_parsing=True)
    err = type("UsageError", (Exception,), {"format_message": lambda self: "No such command 'plna'."})()
    err.ctx = ctx
    assert "Did you mean 'plan'" in usage_errors.describe(err).message


def test_plan_without_a_model_is_exit_2(capsys):
    """Nothing typed: the help, exit 2 as `gpulens` and `gpulens export`; options without --model:
    the one thing missing, in one sentence (it printed the help and exited 0 either way)."""
    from gpulens.cli.main import main

    assert main(["plan"]) == 2
    assert "Usage:" in capsys.readouterr().out
    assert main(["plan", "--gpu", "h100-sxm"]) == 2
    assert "plan needs --model" in " ".join(capsys.readouterr().err.split())
