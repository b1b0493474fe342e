"""Fixtures for the alert tests; the rig itself lives in alerts_rig.py (importable by name)."""

from __future__ import annotations

import pytest
from alerts_rig import Rig


@pytest.fixture
def rig(store):
    r = Rig(store)
    yield r
    r.close()
