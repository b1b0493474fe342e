"""Lazy re-exports (PEP 562): a package names what it re-exports and from which module, and each name
loads on first use. So `import gpulens`, `gpulens.runs` (a fingerprint in a training script) or
`gpulens.gpu` (the NVML backend) does not pay for the store, the monitors or the trace readers."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module-level `__getattr__` for `package`: `exports` maps a name to the module that defines it."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # once loaded, a plain attribute
        return value

    return __getattr__
