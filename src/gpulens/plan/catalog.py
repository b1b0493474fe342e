"""The GPU catalog: datasheet figures with their sources, plus the user's own cards and prices.

`find_gpu("h200")`, `find_gpu("H100-SXM")` and NVML names such as `find_gpu("NVIDIA H100 80GB HBM3")`
all work (case-insensitive). Prices never come from the bundled catalog: only from the user's config
file (`$GPULENS_PLAN_CONFIG`, else `$XDG_CONFIG_HOME/gpulens/plan.yaml`, else `~/.config/gpulens/plan.yaml`).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpulens.errors import BadInputError, shown
from gpulens.safe_parse import load_yaml, read_text

TERA = 1e12
GIGA = 1e9


class UnknownGpuError(BadInputError):
    """A GPU name that is neither in the catalog nor in the user's config file."""

    def __init__(self, name: str, suggestions: list[str], *, hint: str | None = None):
        hint = hint or (
            f"Did you mean {', '.join(suggestions)}? " if suggestions else ""
        ) + "Run `gpulens plan gpus` for the list, or add your card to the plan config file (docs/plan.md)."
        super().__init__(f"Unknown GPU {name!r}.", hint=hint)
        self.name = name
        self.suggestions = suggestions


class UnsupportedPrecisionError(BadInputError):
    """The GPU has no hardware support for the number format asked for (FP8 on an A100, BF16 on a T4)."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. Rates are dense peaks (no sparsity); None = the card lacks the format or the
    vendor publishes no figure."""

    name: str
    memory_bytes: int
    memory_bandwidth_bytes_per_second: float
    bf16_dense_flops: float | None
    fp16_dense_flops: float | None
    fp32_flops: float | None
    tf32_dense_flops: float | None = None
    fp8_dense_flops: float | None = None
    int8_dense_ops: float | None = None
    interconnect: str = ""
    interconnect_bytes_per_second: float | None = None
    tdp_watts: float | None = None
    vendor: str = "nvidia"
    architecture: str = ""
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    hourly_price: float | None = None  # from the user's config only
    purchase_price: float | None = None  # from the user's config only
    user_defined: bool = False
    marketing_memory_gb: float | None = None  # the datasheet's size ("80 GB"); memory_bytes is what a process gets
    memory_source: str = ""  # where memory_bytes comes from: nvidia-smi, measured, or the datasheet size

    # TFLOP/s views (what MFU code and humans read)
    @property
    def bf16_tflops(self) -> float | None:
        return self.bf16_dense_flops / TERA if self.bf16_dense_flops else None

    @property
    def fp16_tflops(self) -> float | None:
        return self.fp16_dense_flops / TERA if self.fp16_dense_flops else None

    @property
    def fp32_tflops(self) -> float | None:
        return self.fp32_flops / TERA if self.fp32_flops else None

    @property
    def fp8_tflops(self) -> float | None:
        return self.fp8_dense_flops / TERA if self.fp8_dense_flops else None

    def supports(self, fmt: str) -> bool:
        return self._rate(fmt) is not None

    def _rate(self, fmt: str) -> float | None:
        fmt = fmt.lower()
        if fmt in ("bf16", "amp_bf16"):
            return self.bf16_dense_flops
        if fmt in ("fp16", "amp_fp16"):
            return self.fp16_dense_flops
        if fmt == "fp32":
            return self.fp32_flops
        if fmt == "fp8":
            return self.fp8_dense_flops
        if fmt in ("int8", "int4"):
            # int4 weight-only kernels dequantize to 16-bit and run 16-bit math
            return self.int8_dense_ops if fmt == "int8" else (self.bf16_dense_flops or self.fp16_dense_flops)
        raise BadInputError(f"Unknown number format {fmt!r}.", hint="Use fp32, bf16, fp16, fp8, int8 or int4.")

    def peak_flops(self, fmt: str) -> float:
        """Dense peak for matmuls in `fmt`; raises a clear error if the card lacks the format."""
        rate = self._rate(fmt)
        if rate is None:
            alt = [f for f in ("bf16", "fp16", "fp32") if self._rate(f) is not None]
            raise UnsupportedPrecisionError(
                f"The {self.name} has no {fmt.upper()} support (or its vendor publishes no {fmt.upper()} figure).",
                hint=f"Use {' or '.join(alt)} on this card, or pick a GPU that has {fmt.upper()}.",
            )
        return rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "marketing_memory_gb": self.marketing_memory_gb,
            "memory_source": self.memory_source,
            "memory_bandwidth_bytes_per_second": self.memory_bandwidth_bytes_per_second,
            "bf16_dense_flops": self.bf16_dense_flops,
            "fp16_dense_flops": self.fp16_dense_flops,
            "fp32_flops": self.fp32_flops,
            "fp8_dense_flops": self.fp8_dense_flops,
            "int8_dense_ops": self.int8_dense_ops,
            "interconnect": self.interconnect,
            "interconnect_bytes_per_second": self.interconnect_bytes_per_second,
            "tdp_watts": self.tdp_watts,
            "hourly_price": self.hourly_price,
            "purchase_price": self.purchase_price,
            "user_defined": self.user_defined,
            "sources": list(self.sources),
        }


def _opt(v: Any, scale: float) -> float | None:
    return None if v is None else float(v) * scale


# A card's figures: each, when given, a positive finite number (a user's `memory_gb: 0` or `.nan`
# once planned a card of -48 GiB, or divided by zero).
_FIGURES = ("memory_bytes", "memory_mib", "memory_gb", "bandwidth_gbps", "bf16_tflops", "fp16_tflops", "fp32_tflops",
            "tf32_tflops", "fp8_tflops", "int8_tops", "interconnect_gbps", "tdp_watts")


_FIGURE_MAX = 1e15  # in each field's own unit: a petabyte of memory_bytes, 1e15 GB/s, 1e15 TFLOPS


def _check_figures(e: dict[str, Any], name: str, where: str) -> None:
    for key in _FIGURES:
        v = e.get(key)
        if v is None:
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(v, bool) or not (math.isfinite(x) and x > 0):
            raise BadInputError(f"The field {key!r} of GPU {name!r} in {where} is {str(v)[:40]!r}, not a positive number.",
                                hint="Write a plain number above 0 (see docs/plan.md).")
        if x > _FIGURE_MAX:  # memory_gb 1e308 overflowed into a traceback; bf16_tflops 1e308 planned in 0 s
            raise BadInputError(f"The field {key!r} of GPU {name!r} in {where} is {str(v)[:40]!r}, beyond any card's "
                                f"figure (at most {_FIGURE_MAX:g}).", hint="Write the card's datasheet figure (see docs/plan.md).")


def _names(e: dict[str, Any], key: str, name: str, where: str) -> tuple[str, ...]:
    """A card's list of names (aliases, nvml_names, sources); one string is a list of one (it was
    split into its letters, and a number raised a TypeError traceback)."""
    v = e.get(key)
    if not v:
        return ()
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, list) or any(isinstance(a, dict | list) for a in v):
        raise BadInputError(f"The field {key!r} of GPU {name!r} in {where} is {str(v)[:40]!r}, not a list of names.",
                            hint=f"Write e.g. `{key}: [first, second]` (see docs/plan.md).")
    return tuple(str(a) for a in v)


def _spec_from_entry(e: dict[str, Any], *, user: bool, where: str) -> GpuSpec:
    if not isinstance(e, dict):  # `- h100` was "a non-numeric size or bandwidth"
        raise BadInputError(f"A GPU entry in {where} is {'empty' if e is None else shown(e)}, not a card's fields.",
                            hint="Each card is a mapping: name, memory_gb (or memory_mib), bandwidth_gbps (see docs/plan.md).")
    if "name" in e and (not isinstance(e["name"], str | int | float) or not str(e["name"]).strip()):
        raise BadInputError(f"A GPU entry in {where} has the name {shown(e['name'])}, not a card's name.",
                            hint="Give each card a name to pass to --gpu, e.g. `name: lab-a6000`.")
    try:
        name = str(e["name"])
        if isinstance(e, dict):
            _check_figures(e, name, where)
        # a datasheet's "80 GB" is neither 80e9 nor 80 GiB usable: an H100 SXM shows 81,559 MiB in
        # nvidia-smi, a T4 15,360 MiB of its "16 GB". Plan against what nvidia-smi prints
        # (memory_mib), a measured figure (memory_bytes) where there is one, else the size as GiB.
        marketing = float(e["memory_gb"]) if e.get("memory_gb") is not None else None
        if e.get("memory_bytes"):
            mem, mem_source = int(e["memory_bytes"]), "measured"
        elif e.get("memory_mib"):
            mem, mem_source = int(float(e["memory_mib"]) * (1 << 20)), "nvidia-smi memory.total"
        else:
            mem, mem_source = int(float(e["memory_gb"]) * (1 << 30)), "datasheet size read as GiB"
        bw = float(e["bandwidth_gbps"]) * GIGA
        if mem < 1:
            raise BadInputError(f"GPU {name!r} in {where} has less than one byte of memory.", hint="Give memory_gb in GB, e.g. 48.")
    except KeyError as k:
        raise BadInputError(
            f"A GPU entry in {where} lacks the field {k.args[0]!r}.",
            hint="Each card needs name, memory_gb (or memory_mib) and bandwidth_gbps (see docs/plan.md).",
        ) from None
    except (TypeError, ValueError):
        raise BadInputError(f"A GPU entry in {where} has a non-numeric size or bandwidth.", hint="Write plain numbers.") from None
    sources = _names(e, "sources", name, where)
    if not user and not sources:
        raise BadInputError(f"Catalog entry {name!r} has no source.", hint="Every catalog figure must cite a datasheet.")
    return GpuSpec(
        name=name,
        memory_bytes=mem,
        memory_bandwidth_bytes_per_second=bw,
        bf16_dense_flops=_opt(e.get("bf16_tflops"), TERA),
        fp16_dense_flops=_opt(e.get("fp16_tflops", e.get("bf16_tflops")), TERA),
        fp32_flops=_opt(e.get("fp32_tflops"), TERA),
        tf32_dense_flops=_opt(e.get("tf32_tflops"), TERA),
        fp8_dense_flops=_opt(e.get("fp8_tflops"), TERA),
        int8_dense_ops=_opt(e.get("int8_tops"), TERA),
        interconnect=str(e.get("interconnect") or ""),
        interconnect_bytes_per_second=_opt(e.get("interconnect_gbps"), GIGA),
        tdp_watts=_opt(e.get("tdp_watts"), 1.0),
        vendor=str(e.get("vendor") or ("user" if user else "")),
        architecture=str(e.get("architecture") or ""),
        aliases=_names(e, "aliases", name, where),
        nvml_names=_names(e, "nvml_names", name, where),
        sources=sources or ("user config",),
        user_defined=user,
        marketing_memory_gb=marketing,
        memory_source=mem_source,
    )


def user_gpu(entry: dict[str, Any], *, where: str) -> GpuSpec:
    """A card as a user's plan.yaml `gpus:` entry describes it (the fields of the bundled catalog)."""
    return _spec_from_entry(entry, user=True, where=where)


@lru_cache(maxsize=1)
def builtin_gpus() -> tuple[GpuSpec, ...]:
    text = resources.files("gpulens.plan").joinpath("data/gpus.yaml").read_text()
    data = yaml.safe_load(text)
    return tuple(_spec_from_entry(e, user=False, where="the bundled catalog") for e in data["gpus"])


# ---------------------------------------------------------------- user config (cards + prices)


def user_config_file(env_var: str, file_name: str) -> Path:
    """The file `$env_var` names, else `file_name` in the user's gpulens folder
    (`$XDG_CONFIG_HOME/gpulens`, else `~/.config/gpulens`): one place for the planner's own files."""
    env = os.environ.get(env_var)
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "gpulens" / file_name


def config_path() -> Path:
    """Where the user's planner config lives (`$GPULENS_PLAN_CONFIG` overrides)."""
    return user_config_file("GPULENS_PLAN_CONFIG", "plan.yaml")


@dataclass(frozen=True)
class UserConfig:
    gpus: tuple[GpuSpec, ...] = ()
    prices: dict[str, dict[str, float]] = field(default_factory=dict)  # normalized gpu name -> {hourly, purchase}
    currency: str = "USD"
    path: Path | None = None


def _refuse_twice(names: list[str], what: str, path: Path) -> None:
    """Two cards or prices under one name as lookups read it (h100-sxm, H100 SXM): the last one won
    without a word."""
    seen: dict[str, str] = {}
    for n in names:
        if _norm(n) in seen:
            raise BadInputError(f"The plan config {path} gives a {what} for {shown(_norm(n))} twice "
                                f"({shown(seen[_norm(n)])} and {shown(n)}).", hint=f"Keep one {what} per GPU.")
        seen[_norm(n)] = n


class _ExponentFloats(yaml.SafeLoader):
    """YAML 1.2's floats: PyYAML (YAML 1.1) reads `purchase: 3e4` as the text "3e4", and a price so
    written was refused as not a number."""


_ExponentFloats.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_user_config(path: Path | None = None) -> UserConfig:
    path = path or config_path()
    if not path.exists():
        return UserConfig(path=path)
    hint = "Fix the YAML or remove the file."
    data = load_yaml(read_text(path, "the plan config", hint=hint), f"the plan config {path}", hint=hint,
                     loader=_ExponentFloats) or {}
    if not isinstance(data, dict):
        raise BadInputError(f"The plan config {path} is not a mapping.", hint="See docs/plan.md for its layout.")
    if not isinstance(data.get("gpus") or [], list):
        raise BadInputError(f"The gpus in {path} must be a list of cards.", hint="See docs/plan.md, 'Your cards and prices'.")
    gpus = tuple(user_gpu(e, where=str(path)) for e in data.get("gpus") or ())
    _refuse_twice([g.name for g in gpus], "card", path)
    raw_prices = data.get("prices") or {}
    if not isinstance(raw_prices, dict):
        raise BadInputError(f"The prices in {path} must be a mapping of GPU name to price.", hint="E.g. `prices: {h100-sxm: 2.49}`.")
    _refuse_twice([str(n) for n in raw_prices], "price", path)
    prices: dict[str, dict[str, float]] = {}
    for gname, p in raw_prices.items():
        if isinstance(p, int | float):
            p = {"hourly": p}
        if not isinstance(p, dict):
            raise BadInputError(f"The price of {gname!r} in {path} must be a number or a mapping.", hint="E.g. `h100-sxm: 2.49`.")
        for k, v in p.items():
            if k not in ("hourly", "purchase"):  # a typo (`hourli: 2`) left the card without a price, silently
                raise BadInputError(f"The price of {gname!r} in {path} has the key {shown(k)}, which is neither hourly "
                                    "nor purchase.", hint="E.g. `h200: {hourly: 3.50, purchase: 32000}`.")
            if (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf):
                raise BadInputError(f"The {k} price of {gname!r} in {path} is {str(v)[:40]!r}, not a number of 0 or more.",
                                    hint="E.g. `h200: {hourly: 3.50, purchase: 32000}`.")
        prices[_norm(str(gname))] = {k: float(v) for k, v in p.items() if k in ("hourly", "purchase")}
    currency = data.get("currency")
    if currency is not None and not (isinstance(currency, str) and 0 < len(currency.strip()) <= 12):
        # a list or a number had been shown as text beside every price ("[1] 2.49/h")
        raise BadInputError(f"The currency in {path} must be a short name such as USD or EUR, not {shown(currency)}.",
                            hint="E.g. `currency: EUR`.")
    return UserConfig(gpus=gpus, prices=prices, currency=(currency or "USD").strip(), path=path)


# ---------------------------------------------------------------- lookup

_PREFIXES = ("nvidia-", "geforce-", "tesla-", "amd-", "instinct-")
_MOBILE = re.compile(r"(^|-)(laptop|mobile|max-q)(-|$)")


def _norm(name: str) -> str:
    s = re.sub(r"[\s_]+", "-", name.strip().lower())
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if s.startswith(p) and len(s) > len(p):
                s, changed = s[len(p) :], True
    return s


def all_gpus(user: UserConfig | None = None) -> list[GpuSpec]:
    """The catalog with the user's cards added (a user card with a catalog name replaces it) and
    the user's prices attached."""
    user = user if user is not None else load_user_config()
    by_name: dict[str, GpuSpec] = {_norm(g.name): g for g in builtin_gpus()}
    for g in user.gpus:
        by_name[_norm(g.name)] = g
    out = []
    for g in by_name.values():
        keys = {_norm(g.name), *(_norm(a) for a in g.aliases), *(_norm(a) for a in g.nvml_names)}
        price = next((user.prices[k] for k in keys if k in user.prices), None)
        if price:
            g = replace(g, hourly_price=price.get("hourly"), purchase_price=price.get("purchase"))
        out.append(g)
    return out


def find_gpu(name: str, *, user: UserConfig | None = None) -> GpuSpec:
    """The GpuSpec for a catalog name, alias or NVML name (the alias table is each entry's
    `aliases` and `nvml_names` in data/gpus.yaml), case-insensitive, spaces and underscores read
    as dashes, a leading vendor word ("NVIDIA", "GeForce", ...) ignored. Nothing else matches:
    unknown names raise UnknownGpuError with the closest names."""
    if not name or not str(name).strip():
        raise BadInputError("No GPU name given.", hint="Pass --gpu NAME, e.g. --gpu h100-sxm.")
    key = _norm(str(name))
    gpus = all_gpus(user)
    index: dict[str, GpuSpec] = {}
    for g in gpus:
        for k in (g.name, *g.aliases, *g.nvml_names):
            index.setdefault(_norm(k), g)
    if key in index:
        return index[key]
    # no prefix matching: "NVIDIA H100 NVL" or "RTX 4090 Laptop GPU" starting with a catalog name
    # are different cards (memory, bandwidth, clocks), so only exact names and aliases match
    if _MOBILE.search(key):
        raise UnknownGpuError(str(name), [], hint=(
            "Laptop and mobile GPUs have less memory, bandwidth and clock than the desktop card of the "
            "same name, and NVIDIA publishes no tensor figures for them: add yours to the plan config "
            "file with its memory_gb, bandwidth_gbps and bf16_tflops (docs/plan.md)."))
    names = sorted({g.name for g in gpus})
    sugg = difflib.get_close_matches(key, list(index), n=3, cutoff=0.5)
    sugg_names = list(dict.fromkeys(index[s].name for s in sugg)) or [n for n in names if key[:2] in n.lower()][:3]
    raise UnknownGpuError(str(name), sugg_names)


# NVML's total and the catalog's usable memory differ by a few MiB of reserved memory; beyond this
# share the card in the machine is another variant than the catalog's (a 96 GB H100 named "NVIDIA H100")
NVML_MEMORY_MISMATCH_RATIO = 0.03


@dataclass(frozen=True)
class NvmlCard:
    """What the catalog makes of a GPU as NVML names it: its entry (None: not in the catalog), and a
    sentence when the machine's memory says it is another variant of that entry."""

    nvml_name: str
    card: GpuSpec | None
    memory_note: str | None = None


def card_for_nvml(nvml_name: str, memory_total_bytes: float | None, *, user: UserConfig | None = None) -> NvmlCard:
    try:
        card = find_gpu(nvml_name, user=user)
    except UnknownGpuError:
        return NvmlCard(nvml_name, None)
    note = None
    if memory_total_bytes and abs(memory_total_bytes - card.memory_bytes) > NVML_MEMORY_MISMATCH_RATIO * card.memory_bytes:
        note = (f"NVML reports {memory_total_bytes / 2**30:.1f} GiB on this {nvml_name}, and the catalog's {card.name} has "
                f"{card.memory_bytes / 2**30:.1f} GiB: the plan uses the catalog's figures. Add the card to your plan "
                "config (docs/plan.md) to plan with its own.")
    return NvmlCard(nvml_name, card, note)

