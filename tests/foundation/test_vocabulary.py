"""No metric family name or GPU field name is spelled as a string literal outside `gpulens.vocab`
(issue 22): a rename is one edit there, and a typo is an import error instead of an empty panel.

What counts as a name:
- series and event names: the string constants of `vocab/names.py` (label names, `*_LABEL`, are not
  series), the series of `vocab/gpu.py`'s table and its derived series (`GPU_UP`...), and the
  dcgm-exporter names it defines; a histogram's `_bucket`, `_sum` and `_count` series count as the name;
- GPU field names: the `GpuSample` and `MigInstanceSample` fields that carry a reading. Their identity
  and bookkeeping fields (`t`, `gpu`, `uuid`, `name`, `lost`, `errors`, `processes`, `mig_instances`,
  `gpu_instance_id`, `compute_instance_id`, `profile`) are left out: they are ordinary words (a label,
  a JSON key, a column) far more often than they name the field.

Where it counts, for every string constant in src/gpulens outside vocab/:
- a string that is exactly a name (or a name's histogram series) fails;
- a string statement (a docstring, or a bare string used as a comment) never fails: it does not run;
- a name inside a longer string fails when that string is code, and passes when it is prose. Prose is
  a plain (not f-) string of words that ends a sentence: it holds a space and ends with `.`, `!`, `?`
  or `:`. Help texts, error messages and hints are written that way, and a name there is a mention a
  person reads. PromQL, SQL, label selectors, templates and every fragment of an f-string are not
  (an f-string can interpolate the constant at no cost), so a name there is read by a machine;
- a name with no underscore (the event `request`) is an English word: only the exact string counts.

Files that must keep an old literal (a
migration of historical data) go in EXEMPT with the reason; a word spelled like a name that means
something else in one file (a chart id, another recorder's key) goes in COINCIDENCES with its meaning.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import gpulens
from gpulens.gpu.types import GpuSample, MigInstanceSample
from gpulens.vocab import gpu, gpu_fields, names

SRC = Path(gpulens.__file__).resolve().parent


# Files that must keep an old literal, with the reason (none today: the store's migrations rename a
# label, `job` -> `train_job`, which is not a series name).
EXEMPT: dict[str, str] = {}

# A word that is spelled like a name but means something else in that file, with what it means there.
COINCIDENCES: dict[tuple[str, str], str] = {
    ("plan/calibration.py", "train_step"): "the calibration figure for step time (FIGURE_TRAIN_STEP), not the event",
    ("views/panels.py", "train_step"): "the id of the step-time chart, not the event",
    ("views/panels.py", "cold_start"): "the id of the cold-start stat, not the event",
    ("workload/training/records.py", "memory_reserved_bytes"): "another recorder's key for torch's reserved memory, not the GPU field",
    ("runs/work.py", "train_batch_size"): "DeepSpeed's config key for the global batch (a setting a run records), not the series",
}

# GpuSample / MigInstanceSample fields that are not readings (see the module docstring).
NOT_READINGS = frozenset({"t", "gpu", "uuid", "name", "lost", "errors", "processes", "mig_instances",
                          "gpu_instance_id", "compute_instance_id", "profile", "device_index"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def reading_fields() -> set[str]:
    return {f.name for c in (GpuSample, MigInstanceSample) for f in dataclasses.fields(c)} - NOT_READINGS


def vocabulary() -> dict[str, str]:
    """Every name the checker looks for -> the constant to use instead."""
    out: dict[str, str] = {}
    for key, value in vars(gpu_fields).items():
        if key.isupper() and isinstance(value, str):
            out[value] = f"gpulens.vocab.gpu_fields.{key}"
    for field in reading_fields():
        out.setdefault(field, "a new constant in gpulens.vocab.gpu_fields")
    for module, path in ((names, "gpulens.vocab.names"), (gpu, "gpulens.vocab.gpu")):
        for key, value in vars(module).items():
            if key.isupper() and isinstance(value, str) and not key.endswith("_LABEL"):
                out[value] = f"{path}.{key}"
    for m in gpu.GPU_METRICS:
        out.setdefault(m.name, f"gpulens.vocab.gpu.{m.name.upper()}")
        for dcgm in (m.dcgm_name, *(a for a, _ in m.dcgm_aliases)):
            if dcgm:
                out[dcgm] = f"the dcgm_name of gpulens.vocab.gpu.METRICS_BY_NAME[gpu.{m.name.upper()}]"
    for dcgm in gpu.DCGM_HELP:
        out.setdefault(dcgm, "a constant in gpulens.vocab.gpu")
    return out


def _pattern(words: dict[str, str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    suffixes = "|".join(HISTOGRAM_SUFFIXES)
    return re.compile(rf"(?<![A-Za-z0-9_])({alternatives})(?:{suffixes})?(?![A-Za-z0-9_])")


def is_prose(text: str) -> bool:
    """A sentence for a person (the rule in the module docstring)."""
    return " " in text.strip() and text.rstrip().endswith((".", "!", "?", ":"))


def find_literals(source: str, filename: str, words: dict[str, str] | None = None) -> list[str]:
    """`file:line: 'name' ...` for every name spelled in `source` where the module docstring says it counts."""
    words = vocabulary() if words is None else words
    pattern = _pattern(words)
    tree = ast.parse(source, filename=filename)
    statements = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in statements:
            continue
        text = node.value
        for match in pattern.finditer(text):
            name = match.group(1)
            exact = match.group(0) == text
            if not exact and ("_" not in name or (id(node) not in in_fstring and is_prose(text))):
                continue
            if (filename, name) in COINCIDENCES:
                continue
            where = "is" if exact else "inside a code string"
            found.append(f"{filename}:{node.lineno}: {match.group(0)!r} {where}: use {words[name]}")
    return found


def _checked_files() -> list[Path]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("vocab/") or rel in EXEMPT:
            continue
        out.append(path)
    return out


def test_no_metric_or_field_name_is_spelled_outside_the_vocabulary():
    words = vocabulary()
    found = [hit for path in _checked_files()
             for hit in find_literals(path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix(), words)]
    assert not found, "names spelled as literals:\n" + "\n".join(found)


def test_exempt_entries_name_real_files():
    for entry in (*EXEMPT, *(path for path, _ in COINCIDENCES)):
        assert (SRC / entry).exists(), f"{entry} is listed but gone: drop it"
    for (path, word), _why in COINCIDENCES.items():
        assert f'"{word}"' in (SRC / path).read_text(encoding="utf-8"), f"{path} no longer spells {word!r}: drop it"


def test_the_checker_catches_planted_literals():
    """The checker cannot pass vacuously: each way of spelling a name is caught, each allowed one is not."""
    planted = '''
"""A docstring may say gpu_power_watts."""
import x
x.query("gpu_power_watts")
x.query("infer_ttft_seconds_bucket")
x.event("request")
getattr(sample, "memory_used_bytes")
x.promql("rate(train_step_seconds_sum[5m])")
x.promql(f"sum by (gpu) ({selector}) / gpu_memory_total_bytes")
x.sql("SELECT id FROM series WHERE name = 'gpu_up'")
HELP = "Only this series, e.g. train_step_seconds."
WORD = "Per request timeout."
LABEL = x.labels("gpu", "uuid", "name")
'''
    hits = find_literals(planted, "planted.py")
    caught = {int(h.split(":")[1]) for h in hits}
    assert caught == {4, 5, 6, 7, 8, 9, 10}, hits
    assert any("gpulens.vocab.gpu.GPU_POWER_WATTS" in h for h in hits)
    assert any("gpulens.vocab.names.EV_REQUEST" in h for h in hits)
    assert any("gpulens.vocab.gpu_fields.MEMORY_USED_BYTES" in h for h in hits)


def test_is_prose_tells_sentences_from_code():
    assert is_prose("Metric name, e.g. gpu_utilization_ratio.")
    assert is_prose("Give one of these:")
    assert not is_prose("rate(train_step_seconds_sum[5m])")
    assert not is_prose("gpu_up == 0")
    assert not is_prose("train_step_seconds.")  # one word: a name with a dot, not a sentence


def test_field_constants_are_the_reading_fields():
    """gpu_fields has one constant per reading field of GpuSample / MigInstanceSample, each named after it."""
    constants = {k: v for k, v in vars(gpu_fields).items() if k.isupper() and isinstance(v, str)}
    assert all(k == v.upper() for k, v in constants.items())
    assert set(constants.values()) == reading_fields()
    assert set(gpu_fields.GPM_FIELDS) <= {f.name for f in dataclasses.fields(MigInstanceSample)}


def test_every_gpu_series_has_its_constant():
    """vocab/gpu.py spells each table series once, as the upper-case constant the table uses."""
    for m in gpu.GPU_METRICS:
        assert getattr(gpu, m.name.upper()) == m.name
        assert gpu.METRICS_BY_FIELD[m.field] is m
        assert m.field in reading_fields()
