"""Checks for what a trace line says, before it becomes a `GpuSample`: the right type, a finite
value, a time within a sane range. A line that fails is skipped with the reason (`BadLine`); the
import goes on with the next one."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from gpulens.gpu.types import GpuInfo, GpuProcess, GpuSample, MigInstanceSample
from gpulens.units import MAX_ABS_VALUE, MAX_RECORDED_TIME_SECONDS, MIN_TIME_SECONDS

MAX_INT = 2**63 - 1
_BOUND = f"{MAX_ABS_VALUE:.0e}".replace("e+", "e")  # the store's bound on a value, as people write it: 1e18


class BadLine(ValueError):
    """A trace line that cannot be read; the message says which field and why."""


@dataclass(frozen=True)
class SkippedLine:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def _show(v: Any) -> str:
    if v is None:  # JSON null, or the field left out: a person reads "missing", not Python's None
        return "missing"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def time_seconds(v: Any, name: str = "t") -> float:
    """A recorded time: a finite number of unix seconds from 1970 to 2100 (what a recording made by
    a working clock can hold; the store's own bound, 2200, is wider)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadLine(f"{name} is {_show(v)}, not a number of seconds")
    try:
        t = float(v)
    except OverflowError:
        raise BadLine(f"{name} is too large to be a time") from None
    if not (MIN_TIME_SECONDS <= t <= MAX_RECORDED_TIME_SECONDS):  # also NaN
        raise BadLine(f"{name} is {_show(v)}, outside 1970..2100")
    return t


def is_sane_time(v: Any) -> bool:
    try:
        time_seconds(v)
    except BadLine:
        return False
    return True


def number(v: Any, name: str) -> float | None:
    """A reading: None, or a finite number of sane magnitude."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadLine(f"{name} is {_show(v)}, not a number")
    try:
        x = float(v)
    except OverflowError:
        raise BadLine(f"{name} is too large") from None
    if not math.isfinite(x):
        raise BadLine(f"{name} is {_show(v)}, not a finite reading")
    if abs(x) > MAX_ABS_VALUE:  # finite, but past what the store keeps
        raise BadLine(f"{name} is {_show(v)}, beyond ±{_BOUND}, which no GPU reading reaches")
    return x


def integer(v: Any, name: str, *, lo: int = 0, hi: int = MAX_INT) -> int | None:
    """None, or a whole number in [lo, hi] (a float is refused: a bit mask or a pid is never one)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadLine(f"{name} is {_show(v)}, not a whole number")
    if not lo <= v <= hi:
        raise BadLine(f"{name} is {_show(v)}, outside {lo}..{hi}")
    return v


def text(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise BadLine(f"{name} is {_show(v)}, not text")
    return v


def flag(v: Any, name: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    raise BadLine(f"{name} is {_show(v)}, not true or false")


def _annotation_kinds(cls: type) -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(cls)}


_SAMPLE_KINDS = _annotation_kinds(GpuSample)
_INFO_KINDS = _annotation_kinds(GpuInfo)
_MIG_KINDS = _annotation_kinds(MigInstanceSample)
_NESTED = ("processes", "errors", "mig_instances")  # lists and maps, checked by their own functions


def _check(name: str, kind: str, v: Any) -> Any:
    if kind.startswith("float"):
        return time_seconds(v, name) if name == "t" else number(v, name)
    if kind.startswith("int"):
        return integer(v, name)
    if kind.startswith("bool"):
        return flag(v, name)
    if kind.startswith("str | None"):
        return None if v is None else text(v, name)
    if kind.startswith("str"):
        return text(v, name)
    return v


_T = TypeVar("_T")


def _nested(v: Any, name: str, entry: str, build: Callable[[dict[str, Any]], _T]) -> list[_T] | None:
    """A nested list of objects (None stays None), each built as it is read: the first fault on a
    line is the one named."""
    if v is None:
        return None
    if not isinstance(v, list):
        raise BadLine(f"{name} is {_show(v)}, not a list")
    out = []
    for e in v:
        if not isinstance(e, dict):
            raise BadLine(f"{entry} is {_show(e)}, not an object")
        out.append(build(e))
    return out


def _process(p: dict[str, Any]) -> GpuProcess:
    used = p.get("used_memory_bytes", p.get("used_bytes"))
    return GpuProcess(pid=integer(p.get("pid"), "pid") or 0, name=text(p.get("name", ""), "process name"),
                      used_memory_bytes=None if used is None else integer(used, "process memory"))


def _mig_instance(m: dict[str, Any]) -> MigInstanceSample:
    kw = {name: _check(name, kind, m[name]) for name, kind in _MIG_KINDS.items() if name in m}
    for required in ("gpu_instance_id", "compute_instance_id", "profile", "uuid"):
        if kw.get(required) is None:
            raise BadLine(f"a MIG instance has no {required}")
    return MigInstanceSample(**kw)


def processes(v: Any) -> list[GpuProcess] | None:
    return _nested(v, "processes", "a process", _process)


def mig_instances(v: Any) -> list[MigInstanceSample] | None:
    """A recording's MIG GPU instances, every field checked against its type."""
    return _nested(v, "mig_instances", "a MIG instance", _mig_instance)


def errors_map(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadLine(f"errs is {_show(v)}, not an object")
    return {str(k): str(e) for k, e in v.items()}


def sample_from_fields(d: dict[str, Any]) -> GpuSample:
    """A GpuSample from a recording's sample line, every field checked against its type."""
    kw: dict[str, Any] = {}
    for name, kind in _SAMPLE_KINDS.items():
        if name in _NESTED or name not in d:
            continue
        kw[name] = _check(name, kind, d[name])
    for required in ("t", "gpu"):
        if required not in kw:
            raise BadLine(f"the sample has no {required}")
    kw.setdefault("uuid", "")
    kw.setdefault("name", "")
    s = GpuSample(**kw)
    s.processes = processes(d.get("processes"))
    s.mig_instances = mig_instances(d.get("mig_instances"))
    s.errors = errors_map(d.get("errors"))
    return s


def check_sample(s: GpuSample) -> GpuSample:
    """Every field of a built sample checked (for formats converted field by field)."""
    for name, kind in _SAMPLE_KINDS.items():
        if name in _NESTED:
            continue
        v = getattr(s, name)
        if kind.startswith("float") and isinstance(v, int) and not isinstance(v, bool):
            v = number(v, name)  # an int reading is fine; keep the type a float
        _check(name, kind, v)
    return s


def info_from_fields(g: Any, position: int) -> GpuInfo:
    """A GpuInfo from a recording header's `gpus` entry."""
    if not isinstance(g, dict):
        raise BadLine(f"GPU {position} of the header is {_show(g)}, not an object")
    kw = {name: _check(name, kind, g[name]) for name, kind in _INFO_KINDS.items() if name in g}
    for required in ("index", "uuid", "name"):
        if required not in kw:
            raise BadLine(f"GPU {position} of the header has no {required}")
    return GpuInfo(**kw)
