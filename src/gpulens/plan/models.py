"""Model descriptions: a Hugging Face config.json (`hf_config`), a bundled preset, or a bare
parameter count, each resolved to a `ModelSpec` (`model_spec`), which everything downstream reads.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpulens.errors import BadInputError, shown
from gpulens.plan.hf_config import (
    UnknownModelTypeError,
    check_config_fields,
    from_hf_config,
    supported_model_types,
)
from gpulens.plan.model_spec import ModelSpec
from gpulens.safe_parse import json_duplicate_key, load_json, read_text

__all__ = ["ModelSpec", "UnknownModelTypeError", "check_config_fields", "format_count", "from_hf_config", "from_param_count",
           "load_model", "parse_param_count", "preset", "preset_names", "supported_model_types"]


@lru_cache(maxsize=1)
def _preset_entries() -> tuple[dict[str, Any], ...]:
    text = resources.files("gpulens.plan").joinpath("data/models.yaml").read_text()
    return tuple(yaml.safe_load(text)["models"])


def preset_names() -> list[str]:
    return [e["name"] for e in _preset_entries()]


def _key(s: str) -> str:
    return re.sub(r"[\s_/]+", "-", s.strip().lower()).removeprefix("meta-")


def preset(name: str) -> ModelSpec:
    """A bundled preset by name or alias (case-insensitive; `meta-llama/Meta-Llama-3-8B` works too)."""
    key = _key(name.split("/")[-1])
    index: dict[str, dict[str, Any]] = {}
    for e in _preset_entries():
        for k in (e["name"], *(e.get("aliases") or ()), e.get("repo", "").split("/")[-1]):
            if k:
                index.setdefault(_key(k), e)
    e = index.get(key)
    if e is None:
        sugg = difflib.get_close_matches(key, list(index), n=3, cutoff=0.5)
        names = list(dict.fromkeys(index[s]["name"] for s in sugg))
        raise BadInputError(
            f"Unknown model {name!r}: not a config.json path, a preset or a parameter count.",
            hint=(f"Did you mean {', '.join(names)}? " if names else "")
            + "Run `gpulens plan models` for the presets, pass a config.json, or a size such as 7b.",
        )
    spec = from_hf_config(dict(e["config"]), name=e["name"], where=f"preset {e['name']}")
    return replace(spec, source=f"preset {e['name']} (config of {e.get('repo', '?')})", published_params=e.get("published_params"))


# ---------------------------------------------------------------- bare parameter counts

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_param_count(text: str) -> int | None:
    m = _COUNT.match(text)
    if not m:
        return None
    return int(float(m.group(1)) * _SCALE[m.group(2).lower()])


_ROUGH_MAX = 10**15  # a thousand trillion parameters, some 500 x the largest published models


def from_param_count(n: int) -> ModelSpec:
    """A LLaMA-shaped model of about `n` parameters, for a rough answer: hidden size from the
    Chinchilla-era aspect ratios (about 128 × layers), GQA 8, a 32k vocabulary."""
    if n < 20_000_000:
        raise BadInputError(f"A model of {n} parameters is too small to plan for.", hint="Give a size such as 125m or 7b.")
    if n > _ROUGH_MAX:  # 9999...t (a 250-digit count) was shaped into a model of 1e240 layers and planned
        said = format_count(n) if n < 10**18 else f"{float(n):.2e}"
        raise BadInputError(f"A model of {said} parameters is beyond the {format_count(_ROUGH_MAX)} the "
                            "planner shapes from a bare size.", hint="Give a size such as 7b or 1.8t, or a config.json.")
    vocab = 32000
    best: ModelSpec | None = None
    best_score = float("inf")
    for h in [*range(128, 1024, 128), *range(1024, 4096, 512), *range(4096, 32769, 1024)]:
        heads = h // 128 if h >= 1024 else max(2, h // 64)
        kv = 8 if heads % 8 == 0 and heads >= 16 else heads
        inter = int(math.ceil(8 * h / 3 / 256)) * 256
        probe = ModelSpec(name="probe", family="llama", hidden_size=h, num_layers=1, num_heads=heads, num_kv_heads=kv,
                          head_dim=h // heads, intermediate_size=inter, vocab_size=vocab)
        layers = round((n - 2 * vocab * h) / probe.layer_params())
        if layers < 2:
            continue
        spec = replace(probe, name=f"~{format_count(n)} (rough)", num_layers=layers, rough=True,
                       source="bare parameter count: LLaMA-like shapes guessed")
        # prefer the usual aspect ratio (hidden ≈ 128 × layers) and a close total
        score = abs(math.log(h / layers / 128)) + 3 * abs(math.log(spec.params / n))
        if score < best_score:
            best, best_score = spec, score
    if best is None:
        raise BadInputError(f"Cannot shape a model of {n} parameters.", hint="Give a size such as 125m or 7b.")
    return best


def format_count(n: float) -> str:
    for unit, s in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= s:
            return f"{n / s:.2f}{unit}"
    return str(int(n))


# ---------------------------------------------------------------- the one entry point


def load_model(ref: str | Path, *, assume_dense: bool = False) -> ModelSpec:
    """`ref` is a path to a config.json (or a folder holding one), a preset name, or a parameter
    count such as `7b` / `350m` (rough: shapes are guessed and the answer says so)."""
    text = str(ref).strip()
    if not text:
        raise BadInputError("No model given.", hint="Pass --model PATH|PRESET|SIZE, e.g. --model llama-3-8b.")
    p = Path(text).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise BadInputError(f"The model config {p} does not exist.", hint="Give the path of a config.json.")
        raw = read_text(p, "the model config", hint="Pass a valid config.json.")
        cfg = load_json(raw, f"the model config {p}", hint="Pass a valid config.json.")
        if not isinstance(cfg, dict):
            raise BadInputError(f"The model config {p} is not a JSON object.", hint="Pass a config.json.")
        twice = json_duplicate_key(raw)
        if twice is not None:  # {"hidden_size": 4096, "hidden_size": 1}: the last one was planned, silently
            raise BadInputError(f"The model config {p} gives the field {shown(twice)} twice.",
                                hint="Keep one value per field.")
        # the config's own name, else the file itself: a folder's name ("snapshots/3f2a…", "tmp")
        # says nothing reliable about the model inside
        name = str(cfg.get("_name_or_path") or "").strip() or str(p)
        return from_hf_config(cfg, name=name, where=str(p), assume_dense=assume_dense)
    n = parse_param_count(text)
    if n is not None:
        return from_param_count(n)
    return preset(text)
