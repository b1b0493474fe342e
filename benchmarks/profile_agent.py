"""Profile `gpulens agent` in-process with cProfile on CPU time (not wall time: the loop mostly sleeps,
and on a loaded machine wall time charges a function for others' CPU).

    python benchmarks/profile_agent.py OUT.prof --backend fake:8 --interval 100ms --listen off --store /tmp/p/g.db --duration 300s
    python -c "import pstats; pstats.Stats('OUT.prof').sort_stats('tottime').print_stats(30)"

Everything after OUT.prof is the agent's own command line. Start-up is in the profile too; read the
steady state under `SamplingLoop.run`.
"""

from __future__ import annotations

import cProfile
import sys
import time


def main(argv: list[str]) -> int:
    out, args = argv[1], argv[2:]
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        from gpulens.cli.main import main as gpulens_main

        rc = gpulens_main(["agent", *args])
    finally:
        prof.disable()
        prof.dump_stats(out)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
