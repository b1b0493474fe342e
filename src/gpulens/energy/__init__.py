"""Energy per workload: joules, mean watts and joules per token, sample and request (docs/energy.md)."""

from gpulens.energy.attribute import WorkloadEnergy, joules_per_token, workload_energy
from gpulens.energy.joules import SpanEnergy, counter_joules, power_joules
from gpulens.energy.summary import energy_line

__all__ = ["SpanEnergy", "WorkloadEnergy", "counter_joules", "energy_line", "joules_per_token", "power_joules", "workload_energy"]
