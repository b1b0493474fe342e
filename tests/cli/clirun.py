"""Run the installed CLI the way a user does: the `gpulens` script beside this Python, or `python -m gpulens`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GPULENS_SCRIPT = Path(sys.executable).with_name("gpulens")
ENTRY_POINTS = {
    "script": [str(GPULENS_SCRIPT)],
    "python -m": [sys.executable, "-m", "gpulens"],
}


def run_gpulens(*args: str, entry: str = "script", columns: int = 80, timeout: float = 60,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A pipe for stdout and stderr (not a TTY), a terminal width of `columns`."""
    env = {**os.environ, "COLUMNS": str(columns), **(extra_env or {})}
    env.pop("FORCE_COLOR", None)
    return subprocess.run([*ENTRY_POINTS[entry], *args], capture_output=True, text=True, timeout=timeout, env=env)
