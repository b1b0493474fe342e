"""A fleet on one machine, for tests, benchmarks and `gpulens demo --fleet N`: N `gpulens agent`s as N
nodes (fake GPUs, distinct host labels), workloads writing to their node's store, and one real
Prometheus scraping them all (gpulens.fleet.rig).

Layer: beside bench (tests/foundation/test_layers.py). It builds on the store and the workload
records (the processes it runs write what a monitor writes) and on nothing above them; the agents it
starts are processes (`python -m gpulens.cli.main agent`), not imports, so no arrow points up to cli.
"""

from gpulens.fleet.rig import JOB, SERVICE, XID, FleetRig, FleetStartError, demo_rig

__all__ = ["JOB", "SERVICE", "XID", "FleetRig", "FleetStartError", "demo_rig"]
