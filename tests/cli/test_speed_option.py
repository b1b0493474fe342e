"""`--speed` is a factor of the recorded pace in every command that has it: `2m` used to read as a
duration (120x); now it is refused with one sentence and exit 2 (issue 22)."""

from __future__ import annotations

import pytest

from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.units import parse_speed

COMMANDS = {
    "replay": ["replay", "no-such-trace"],
    "top": ["top", "--backend", "fake:1", "--duration", "1s"],
    "demo": ["demo", "--duration", "1s"],
    "agent": ["agent", "--backend", "fake:1", "--duration", "1s", "--listen", "off"],
    "bench serve": ["bench", "serve", "--url", "http://127.0.0.1:9/", "--rate", "1"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("speed", "needle"), [("2m", "not a duration"), ("0", "above zero"), ("-1", "above zero")])
def test_a_duration_or_zero_speed_is_one_sentence_and_exit_2(command, speed, needle, tmp_path, capsys):
    rc = main([*COMMANDS[command], "--store", str(tmp_path / "s.db"), "--speed", speed] if command != "top"
              else [*COMMANDS[command], "--speed", speed])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert lines[0].startswith("error: ") and "--speed" in lines[0] and needle in " ".join(err.split()), err
    assert len(lines) <= 3 and "Traceback" not in err  # the sentence and its hint (wrapped at most once)


@pytest.mark.parametrize(("text", "factor"), [("2", 2.0), ("2x", 2.0), ("10X", 10.0), (" 50.5 ", 50.5), ("0.5", 0.5), (".5x", 0.5), (3, 3.0)])
def test_a_factor_reads_as_itself(text, factor):
    assert parse_speed(text) == factor


def test_max_only_where_the_command_allows_it():
    assert parse_speed("max", allow_max=True) is None
    with pytest.raises(BadInputError, match="a factor of the recorded pace, written as a plain decimal"):
        parse_speed("max")
    with pytest.raises(BadInputError, match="a factor of the recorded pace, written as a plain decimal"):
        parse_speed("1e-300")  # it is not a duration either: the sentence said so


@pytest.mark.parametrize("text", ["2m", "1s", "fast", "", "inf", "nan", "1e99", "0x", float("inf"), 0, -2, True])
def test_anything_else_is_refused(text):
    with pytest.raises(BadInputError):
        parse_speed(text)
