"""A plan.yaml past the YAML reader's 200,000 values is refused saying why: a file that holds that
many (a prices map of 200,000 cards) had been told its "aliases expand" past the limit, though it
has no alias; a file whose aliases do expand it (a "billion laughs") is told so."""

from __future__ import annotations

import pytest

from gpulens.cli.main import main


def _plan(capsys: pytest.CaptureFixture[str], path, text: str) -> tuple[int, str]:
    path.write_text(text)
    rc = main(["plan", "--model", "7b", "--gpu", "h200"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, err


def test_a_plan_yaml_holding_too_many_values_is_not_said_to_use_aliases(capsys, isolated_plan_config):
    rc, err = _plan(capsys, isolated_plan_config, "prices:\n" + "".join(f"  gpu{i}: 1.0\n" for i in range(200_000)))
    assert rc == 2, err
    assert "holds more than 200,000 values" in err and "alias" not in err, err


def test_a_plan_yaml_whose_aliases_expand_past_the_limit_says_so(capsys, isolated_plan_config):
    text = "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
    for name, prev in zip("bcde", "abcd", strict=True):
        text += f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n"
    rc, err = _plan(capsys, isolated_plan_config, text + "f: [*e, *e, *e]\n")
    assert rc == 2, err
    assert "aliases expand to more than 200,000 values" in err, err
