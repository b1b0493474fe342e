"""The node's name: the one `host` label every series of a node carries, the agent's and the
monitors' alike, so a `$host` picker built from any series finds every panel's.

In a Kubernetes pod the machine's name is the pod's, not the node's: the chart sets `GPULENS_HOST`
from `spec.nodeName` (the downward API) for the agent, and a workload's pod spec sets it the same way
(docs/metrics.md), so a training rank and the agent beside it agree without being told twice.
"""

from __future__ import annotations

import os
import socket

HOST_ENV = "GPULENS_HOST"


def node_host(explicit: str | None = None) -> str:
    """`explicit` (a `--host` or `host=` given), else $GPULENS_HOST, else this machine's name."""
    return explicit or os.environ.get(HOST_ENV, "").strip() or socket.gethostname()
