"""Files built to hurt a reader: shared by the hostile-input table (in-process, every reader) and the
agent-under-hostile-input test (a real agent process, stopped with SIGTERM)."""

from __future__ import annotations

ALIAS_BOMB = ('a: &a ["x","x","x","x","x","x","x","x","x"]\n'
              + "".join(f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
              ).encode()
HOSTILE_FILES: dict[str, bytes] = {
    "list nested 200000 deep": b"[" * 200_000,
    "object nested 100000 deep": b'{"a":' * 100_000,
    "list nested 100 deep": b"[" * 100 + b"]" * 100,
    "a 5000-digit integer": b'{"x": ' + b"1" * 5000 + b"}",
    "a 40-digit integer": b'{"x": ' + b"7" * 40 + b"}",
    "invalid UTF-8": b'{"x": "\xff\xfe\xfd"}\n',
    "Latin-1 text": '{"x": "caf\u00e9"}\n'.encode("latin-1"),
    "1e400": b'{"x": 1e400}\n',
    "-1e400": b'{"x": -1e400}\n',
    "NaN": b'{"x": NaN}\n',
    "Infinity": b'{"x": Infinity}\n',
    "-Infinity in a list": b"[-Infinity]\n",
    "truncated JSON": b'{"x": [1, 2',
    "empty": b"",
    "blank lines": b"\n\n   \n\t\n",
    "NUL bytes": b"\x00" * 64,
    "a BOM": b'\xef\xbb\xbf{"x": 1}\n',
    "a string at the top": b'"hello"\n',
    "a number at the top": b"42\n",
    "null at the top": b"null\n",
    "a list of numbers": b"[1, 2, 3]\n",
    "one 2 MB line": b'{"x": "' + b"a" * 2_000_000 + b'"}\n',
    "binary garbage": bytes(range(256)) * 16,
    "a good line, then a deep one": b'{"x": 1}\n' + b"[" * 200_000 + b"\n",
    "a YAML alias bomb": ALIAS_BOMB,
    "YAML nested 5000 deep": b"a: " + b"[" * 5000,
    "a YAML python tag": b"a: !!python/object/apply:os.system ['true']\n",
    "a YAML undefined alias": b"a: *nowhere\n",
    "YAML tabs": b"rules:\n\t- name: x\n",
    "a YAML list as a key": b"? [1, 2]\n: 3\n",
    "a YAML impossible date": b"a: 2001-02-30\n",
}
