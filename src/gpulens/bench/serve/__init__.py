"""`gpulens bench serve`: a load tester free of coordinated omission, with SLO sweeps.

    from gpulens.bench.serve import LoadSpec, Target, run_load, sweep, parse_slos
"""

from gpulens.bench.serve.api import Probe, SweepResult, run_load, sweep
from gpulens.bench.serve.client import RequestRecord, Target, openai_body, target_kind_for
from gpulens.bench.serve.runner import LoadSpec, Progress, TargetUnreachableError
from gpulens.bench.serve.stats import (
    Concurrency,
    LoadSummary,
    Percentiles,
    RequestCounts,
    RequestRates,
    SloResult,
)
from gpulens.bench.serve.summary import LoadResult
from gpulens.vocab.slo import Slo, parse_slo, parse_slos

__all__ = [
    "Concurrency", "LoadResult", "LoadSpec", "LoadSummary", "Percentiles", "Probe", "Progress", "RequestCounts",
    "RequestRates", "RequestRecord", "Slo", "SloResult", "SweepResult", "Target", "TargetUnreachableError",
    "openai_body", "parse_slo", "parse_slos", "run_load", "sweep", "target_kind_for",
]
