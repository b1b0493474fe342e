"""Differences between two configurations or fingerprints, as flat dotted keys ("gpus.0.vbios")
so that one changed field reads as one line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class Change:
    key: str
    old: Any  # None when the key is new
    new: Any  # None when the key was removed

    @property
    def what(self) -> str:
        if self.old is None:
            return "added"
        if self.new is None:
            return "removed"
        return "changed"

    def __str__(self) -> str:
        if self.old is None:
            return f"{self.key}: (none) → {self.new!r}"
        if self.new is None:
            return f"{self.key}: {self.old!r} → (none)"
        return f"{self.key}: {self.old!r} → {self.new!r}"


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [x, y]} -> {"a.b": 1, "c.0": x, "c.1": y}. Empty containers vanish:
    "no variables set" and "no variables key" are the same environment."""
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
    else:
        out[prefix] = obj
    return out


def diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, *, ignore: tuple[str, ...] = ()) -> list[Change]:
    """Changed, added and removed keys from `old` to `new`, sorted by key. Keys starting with one of
    `ignore` are skipped (e.g. a host name that differs on every CI runner)."""
    a, b = flatten(old or {}), flatten(new or {})
    out = []
    for key in sorted(set(a) | set(b)):
        if ignore and key.startswith(ignore):
            continue
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va == vb:
            continue
        out.append(Change(key, None if va is _MISSING else va, None if vb is _MISSING else vb))
    return out
