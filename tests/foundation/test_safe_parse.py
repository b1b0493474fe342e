"""gpulens.safe_parse: the one parsing discipline for untrusted files and values (issue 27 item 5).
The hostile table (tests/reliability/test_hostile_inputs.py) drives it through every reader; these
pin its own promises: where a bad number is, files refused by kind before they are opened, the
fast path agreeing with the checked one."""

from __future__ import annotations

import json
import os

import pytest

from gpulens.errors import BadInputError
from gpulens.safe_parse import (
    MAX_INT_DIGITS,
    SQLITE_INT_MAX,
    UnsafeValue,
    UnsafeYaml,
    finite,
    json_lines,
    json_value,
    load_json,
    read_text,
    sqlite_int,
    yaml_value,
)


def test_a_bad_number_is_named_with_its_line_column_and_key():
    text = '{"a": 1,\n "hidden_size": 1e400}'
    with pytest.raises(UnsafeValue, match=r"1e400 at line 2, column 17 \(key 'hidden_size'\), which is too large"):
        json_value(text)
    with pytest.raises(BadInputError, match=r"^The model config x\.json cannot be read: it holds NaN at line 1, column 7"):
        load_json('{"x": NaN}', "the model config x.json", hint="Fix it.")


@pytest.mark.parametrize("text", ["NaN", "-Infinity", "[1e999]", "1" + "0" * MAX_INT_DIGITS, "[" * 100_000, '{"a":' * 65 + "1" + "}" * 65])
def test_the_checked_reader_refuses(text):
    with pytest.raises(UnsafeValue):
        json_value(text)


def test_the_fast_path_reads_what_the_checked_one_does():
    """A recording's reader skips the per-number checks (its fields are checked one by one): it must
    still refuse NaN and depth, and read ordinary lines identically."""
    line = json.dumps({"t": 1796002115.5, "gpu_util": 100, "mem_used": 1570635776, "x": [1.5e-05, -3, None, "e400"]})
    assert json_value(line, check_numbers=False) == json_value(line) == json.loads(line)
    for bad in ('{"x": NaN}', "[" * 5000):
        with pytest.raises(UnsafeValue):
            json_value(bad, check_numbers=False)


def test_json_lines_names_the_line():
    with pytest.raises(BadInputError, match=r"^Line 3 of the dataset d\.jsonl cannot be read: it is not JSON"):
        list(json_lines('{"a": 1}\n\n{"a": \n', "the dataset d.jsonl", hint="One object per line."))


def test_files_are_refused_by_kind_before_they_are_opened(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    with pytest.raises(BadInputError, match="is not a regular file"):
        read_text(fifo, "the rule file", hint="Check the path.")
    with pytest.raises(BadInputError, match="is not a regular file"):
        read_text("/dev/zero", "the dataset", hint="Check the path.")  # would be read to exhaustion
    with pytest.raises(BadInputError, match="is a folder"):
        read_text(tmp_path, "the dataset", hint="Check the path.")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(BadInputError, match="more than the 100 gpulens reads"):
        read_text(big, "the dataset", hint="Check the path.", max_bytes=100)
    bad = tmp_path / "bad"
    bad.write_bytes(b"ok\n\xff")
    with pytest.raises(BadInputError, match=r"is not UTF-8 text \(byte 4 is 0xff\)"):
        read_text(bad, "the dataset", hint="Check the path.")


def test_numbers_for_the_store():
    assert sqlite_int(SQLITE_INT_MAX, "--limit") == SQLITE_INT_MAX
    with pytest.raises(UnsafeValue, match="beyond the largest whole number"):
        sqlite_int(SQLITE_INT_MAX + 1, "--limit")
    assert finite(2.5, "--rate") == 2.5
    for v in (float("nan"), float("inf"), True, "1"):
        with pytest.raises(UnsafeValue):
            finite(v, "--rate")  # type: ignore[arg-type]


def test_yaml_aliases_are_counted_as_they_expand():
    ok = "a: &a [1, 2, 3]\nb: [*a, *a]\n"
    assert yaml_value(ok) == {"a": [1, 2, 3], "b": [[1, 2, 3], [1, 2, 3]]}
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcde", "bcdef", strict=True))
    with pytest.raises(UnsafeValue, match="aliases expand"):
        yaml_value(bomb)


def test_a_yaml_key_given_twice_is_refused_with_its_lines():
    """PyYAML keeps the last of two equal keys silently; YAML and Prometheus's readers refuse them."""
    with pytest.raises(UnsafeYaml, match=r"the key 'name' is given twice \(lines 2 and 3\)") as e:
        yaml_value("rules:\n  - name: A\n    name: B\n")
    assert e.value.line == 3
    with pytest.raises(UnsafeYaml, match=r"the key 'x' is given twice \(line 1\)"):
        yaml_value("{x: 1, x: 2}\n")
    # equal keys in different mappings, a merge key overridden, 1 and '1': no duplicates
    assert yaml_value("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}
    assert yaml_value("a: &m {x: 1}\nb:\n  <<: *m\n  x: 2\n") == {"a": {"x": 1}, "b": {"x": 2}}
    assert yaml_value("1: a\n'1': b\n") == {1: "a", "1": "b"}
