"""Per-example evaluation results, read from files: lm-evaluation-harness `--log_samples` output
(`samples_<task>_<date>.jsonl`, one line per document and filter) or a plain JSONL that any other
evaluator can write (`{"id": ..., "<metric>": value}` per line).

A folder is searched for lm-eval sample files (lm-eval writes them under
`<output_path>/<model>/`); one task must be named when it holds several.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gpulens.errors import BadInputError
from gpulens.safe_parse import json_lines, read_text

LM_EVAL_FORMAT = "lm-eval"
PLAIN_FORMAT = "jsonl"


@dataclass(frozen=True)
class ExampleScores:
    """One metric's value per example id, from one file."""

    path: Path
    format: str  # lm-eval or jsonl
    metric: str
    values: dict[str, float]  # example id -> value

    def __len__(self) -> int:
        return len(self.values)


def find_sample_file(path: Path, task: str | None) -> Path:
    """`path` itself if it is a file; in a folder, the one lm-eval samples file of `task`."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise BadInputError(f"There is no file or folder {path}.", hint="Point at an lm-eval --log_samples file or folder, or a JSONL of per-example results.")
    found = sorted(path.rglob("samples_*.jsonl"))
    if task is not None:
        found = [p for p in found if p.name.startswith(f"samples_{task}_")]
    if len(found) == 1:
        return found[0]
    if not found:
        what = f"for task {task!r} " if task else ""
        raise BadInputError(f"The folder {path} holds no lm-eval samples file {what}(samples_<task>_*.jsonl).",
                            hint="Run lm-eval with --log_samples --output_path, or point at the file itself.")
    names = ", ".join(p.name for p in found[:4]) + (" ..." if len(found) > 4 else "")
    raise BadInputError(f"The folder {path} holds {len(found)} lm-eval samples files ({names}).",
                        hint="Name one with --task, or point at the file itself.")


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float) and math.isfinite(v):
        return float(v)
    return None


def read_scores(path: Path, metric: str, *, task: str | None = None, filter_name: str | None = None) -> ExampleScores:
    """The per-example values of `metric` in the file (or folder) `path`."""
    file = find_sample_file(path, task)
    hint = "Each line must be one JSON object."
    rows = []
    for n, row in json_lines(read_text(file, "the samples file", hint=hint), str(file), hint=hint):
        if not isinstance(row, dict):
            raise BadInputError(f"Line {n} of {file} is not a JSON object.")
        rows.append((n, row))
    return scores_from_rows(rows, metric, file, filter_name=filter_name)


def scores_from_rows(rows: list[tuple[int, dict]], metric: str, file: Path, *, filter_name: str | None = None) -> ExampleScores:
    """The per-example values of `metric` in parsed lines ((line number, object) pairs) of `file`
    (an lm-eval samples file when the first has `doc_id`, else a plain JSONL)."""
    if not rows:
        raise BadInputError(f"{file} has no examples.")
    lm_eval = "doc_id" in rows[0][1]
    if lm_eval:
        filters = sorted({str(r.get("filter", "none")) for _, r in rows})
        if filter_name is None and len(filters) > 1:
            raise BadInputError(f"{file} scores each example under {len(filters)} lm-eval filters ({', '.join(filters)}).",
                                hint="Name one with --filter.")
        if filter_name is not None:
            if filter_name not in filters:
                raise BadInputError(f"{file} has no lm-eval filter {filter_name!r}; it has {', '.join(filters)}.")
            rows = [(n, r) for n, r in rows if str(r.get("filter", "none")) == filter_name]
    values: dict[str, float] = {}
    id_key = "doc_id" if lm_eval else "id"
    for n, row in rows:
        if id_key not in row:
            raise BadInputError(f"Line {n} of {file} has no {id_key!r} field.",
                                hint='A plain JSONL needs {"id": ..., "<metric>": value} on every line.')
        if metric not in row:
            have = sorted(k for k, v in row.items() if _number(v) is not None and k not in (id_key,))
            raise BadInputError(f"Line {n} of {file} has no metric {metric!r}.",
                                hint=f"It has {', '.join(have) or 'no numeric fields'}; pass one with --metric.")
        v = _number(row[metric])
        if v is None:
            raise BadInputError(f"Line {n} of {file}: {metric} is {row[metric]!r}, not a number.",
                                hint="Per-example values must be numbers (lm-eval's corpus-level metrics such as word_perplexity cannot be paired).")
        key = str(row[id_key])
        if key in values:
            raise BadInputError(f"Line {n} of {file} repeats example id {key!r}.", hint="Each example must appear once.")
        values[key] = v
    return ExampleScores(file, LM_EVAL_FORMAT if lm_eval else PLAIN_FORMAT, metric, values)


def paired(baseline: ExampleScores, candidate: ExampleScores) -> tuple[list[str], list[float], list[float]]:
    """The ids both files scored, and their values in the same order; refuses different sets."""
    a, b = set(baseline.values), set(candidate.values)
    if a != b:
        only_a, only_b = sorted(a - b), sorted(b - a)
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in the baseline (e.g. {', '.join(only_a[:3])})")
        if only_b:
            parts.append(f"{len(only_b)} only in the candidate (e.g. {', '.join(only_b[:3])})")
        raise BadInputError(f"The two files score different examples: {'; '.join(parts)}.",
                            hint="Evaluate both models on the same examples (same task, same --limit) so each example is compared with itself.")
    ids = sorted(a, key=lambda k: (len(k), k))
    return ids, [baseline.values[k] for k in ids], [candidate.values[k] for k in ids]
