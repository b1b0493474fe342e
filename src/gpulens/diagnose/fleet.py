"""Diagnosis over a fleet's Prometheus (gpulens.reader.prometheus): the same analyzers and incidents
as over a node's store, across every node the reader's selector matches. A GPU finding also names
the pod that held the GPU where its series carry one (agents with pod attribution), and one note
says what was skipped because Prometheus keeps no per-step or per-request records."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulens.diagnose.base import DiagnoseScope, Finding, diagnose
from gpulens.k8s.attribution import POD_LABELS
from gpulens.reader.prometheus import PrometheusAnalysisReader
from gpulens.vocab.gpu import GPU_UP


@dataclass
class FleetDiagnosis:
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)  # one sentence each: what was skipped, and why


def diagnose_fleet(reader: PrometheusAnalysisReader, scope: DiagnoseScope | None = None) -> FleetDiagnosis:
    findings = diagnose(reader, scope)
    name_pods(reader, findings)
    note = reader.skipped_note()
    return FleetDiagnosis(findings, [note] if note else [])


def name_pods(reader: PrometheusAnalysisReader, findings: list[Finding]) -> None:
    """Add pod, namespace and container to each finding on a GPU from the labels of that GPU's series."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for f in findings:
        host, gpu = f.labels.get("host"), f.labels.get("gpu")
        if not host or gpu is None:
            continue
        if (host, gpu) not in seen:
            held = reader.series_labels(GPU_UP, {"host": host, "gpu": gpu})
            seen[(host, gpu)] = {k: ",".join(vals) for k in POD_LABELS if (vals := sorted({lab[k] for lab in held if lab.get(k)}))}
        for k, v in seen[(host, gpu)].items():
            f.labels.setdefault(k, v)
