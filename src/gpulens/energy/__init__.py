"""Energy per workload: joules, mean watts and joules per token, sample and request (docs/energy.md)."""

from gpulens.energy.attribute import WorkloadEnergy, joules_per_token, workload_energy
from gpulens.energy.joules import SpanEnergy, counter_joules, power_joules

__all__ = ["SpanEnergy", "WorkloadEnergy", "counter_joules", "joules_per_token", "power_joules", "workload_energy"]
