"""Tune tests run the bundled examples: a real CPU torch training script and a real local ASGI server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tune"


@pytest.fixture(scope="session")
def train_script() -> list[str]:
    pytest.importorskip("torch", reason="the training example needs torch (CPU is enough)")
    return [sys.executable, str(EXAMPLES / "train_input_bound.py")]


@pytest.fixture(scope="session")
def server_script() -> str:
    pytest.importorskip("uvicorn", reason="the example server runs on uvicorn")
    return f"{sys.executable} {EXAMPLES / 'batching_server.py'}"
