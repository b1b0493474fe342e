"""One line of text per workload's energy, as `gpulens diagnose`'s summary prints it: the per-token
(and per-sample or per-request) figures at the precision `gpulens energy`'s table prints them."""

from __future__ import annotations

from gpulens.energy.attribute import WorkloadEnergy

PRECISION = ".3g"  # `gpulens energy`'s table and the dashboard's stat print J/token to 3 significant digits


def energy_line(row: WorkloadEnergy) -> str:
    """E.g. "training h200-demo on gpu 0: 0.412 J/token, 211 J/sample (95.3 kJ over 300 s, 318 W mean)"."""
    where = f"{row.workload} {row.name}" + (f" rank {row.rank}" if row.rank not in (None, "") else "") + f" on gpu {row.gpu}"
    if row.joules is None:
        return f"{where}: no energy ({row.note})"
    per = [f"{v:{PRECISION}} {unit}" for v, unit in ((row.joules_per_token, "J/token"), (row.joules_per_sample, "J/sample"),
                                                      (row.joules_per_request, "J/request")) if v is not None]
    watts = f", {row.mean_watts:.0f} W mean" if row.mean_watts is not None else ""
    line = f"{where}: {', '.join(per) or 'no tokens'} ({row.joules / 1000:.3g} kJ over {row.seconds:.0f} s{watts})"
    return line + (f"; {row.note}" if row.note else "")
