"""The job's findings for a tracker, at the end of training: the same diagnosis `gpulens diagnose
--job J --format json` gives, in this process, over the monitor's own store (flushed first)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpulens.diagnose import DiagnoseScope, diagnose

if TYPE_CHECKING:
    from gpulens.workload.training.monitor import TrainingMonitor


def job_findings(monitor: TrainingMonitor) -> list[dict[str, Any]]:
    """A `trackers.FindingsSource`: the monitor's job's findings as JSON-ready dicts (none when the
    monitor sends to an agent: the records are in the agent's store, `gpulens diagnose` reads it there)."""
    if monitor.store is None:
        return []
    monitor.store.flush()
    return [f.to_dict() for f in diagnose(monitor.store, DiagnoseScope(job=monitor.job))]
