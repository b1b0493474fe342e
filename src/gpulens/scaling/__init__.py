"""A scaling signal an autoscaler can act on: the desired replica count per service by the
Kubernetes HPA rule (docs/scale.md)."""

from gpulens.scaling.desired import ScalePoint, ServiceScaler, desired_replicas, recommend
from gpulens.scaling.hpa import ScalePolicy, Stabilizer, hpa_recommendation
from gpulens.scaling.signals import Signal, Targets

__all__ = ["ScalePoint", "ScalePolicy", "ServiceScaler", "Signal", "Stabilizer", "Targets", "desired_replicas",
           "hpa_recommendation", "recommend"]
