"""deploy/autoscaling/: the KEDA ScaledObject and the HPA (with prometheus-adapter's rule) validate
against the Kubernetes schemas offline, and read the series gpulens exports."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpulens.scaling.promql import DESIRED_RULE

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (the dev extra)")
import jsonschema  # noqa: E402  (a dependency of kubernetes-validate)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "autoscaling"
KEDA_SCHEMA = Path(__file__).parent / "data" / "keda.sh_scaledobjects.v1alpha1.schema.json"
K8S_VERSION = "1.37.0"


def _strict(schema: dict) -> dict:
    """A CRD schema that refuses unknown fields, as `kubectl apply --validate=strict` does."""
    s = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def _keda_errors(doc: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(_strict(json.loads(KEDA_SCHEMA.read_text())))
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_keda_scaled_object_validates_and_reads_the_recording_rule() -> None:
    doc = yaml.safe_load((DEPLOY / "keda-scaledobject.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert _keda_errors(doc) == []
    trig = doc["spec"]["triggers"][0]
    assert trig["type"] == "prometheus" and DESIRED_RULE in trig["metadata"]["query"]
    bad = copy.deepcopy(doc)
    bad["spec"]["minReplicas"] = 1  # the HPA's spelling, not KEDA's
    assert any("minReplicas" in e for e in _keda_errors(bad))


def test_the_hpa_and_the_adapter_rule_validate_against_kubernetes() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "hpa-prometheus-adapter.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "HorizontalPodAutoscaler"]
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    adapter = yaml.safe_load(docs[0]["data"]["config.yaml"])
    (rule,) = adapter["externalRules"]
    assert DESIRED_RULE in rule["seriesQuery"]
    metric = docs[1]["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert rule["name"]["as"] == metric
    bad = copy.deepcopy(docs[1])
    bad["spec"]["metrics"][0]["external"]["target"]["averageValu"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
