"""`gpulens demo --fleet N`: the fleet rig (gpulens.fleet.rig) as a demo. Starts N agents as N nodes,
a multi-node job with a straggler and an XID, a service, and a real Prometheus scraping them; prints
the Prometheus URL and the commands to try; runs until Ctrl-C (or SIGTERM), then stops every process
it started and removes its temp folder. No `prometheus` on PATH: one sentence, exit 3."""

from __future__ import annotations

import sys
import threading

from rich.markup import escape

from gpulens.cli.agent import install_stop_handlers
from gpulens.cli.common import console

ALIVE_CHECK_SECONDS = 1.0


def run_fleet_demo(nodes: int) -> None:
    from gpulens.errors import UnavailableError
    from gpulens.fleet.rig import dead_process, demo_rig, describe, prometheus_binary

    rig = demo_rig(nodes)  # bad N: one sentence, exit 2
    prometheus_binary()  # none: one sentence, exit 3, before anything starts
    stop = threading.Event()
    install_stop_handlers(stop)
    try:
        with console.status(f"starting {nodes} agents and Prometheus …"):
            rig.start()
        url = rig.prom_url
        lines = [*describe(rig), "", "Try:",
                 f"  gpulens diagnose --prometheus {url} --window 10m      # the straggler and the XID, found across nodes",
                 f"  gpulens report --prometheus {url} --match '{{host=~\"node-[01]\"}}' --window 10m --out fleet.html",
                 f"  gpulens scale --prometheus {url} --window 10s --span 5m",
                 "The job's first findings need about 20 s of steps. Ctrl-C stops everything and removes the work folder."]
        console.print(escape("\n".join(lines)), highlight=False, soft_wrap=True)
        sys.stdout.flush()
        while not stop.wait(ALIVE_CHECK_SECONDS):
            if (dead := dead_process(rig)) is not None:
                raise UnavailableError(f"The fleet's {dead} exited on its own ({rig.log(dead).strip().splitlines()[-1:] or 'no log'}).",
                                       hint="Run the demo again; if it recurs, run `gpulens agent --backend fake:4` alone to see why.")
    finally:
        rig.stop()
