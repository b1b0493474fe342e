"""The public API is what `gpulens/__init__.py` names; importing it stays light (no torch, no web stack)."""

import subprocess
import sys

import gpulens

PUBLIC = {
    "BackendUnavailableError", "BadInputError", "FakeBackend", "GpuBackend", "GpuInfo", "GpuProcess", "GpuSample",
    "GpulensError", "InferenceMiddleware", "InferenceMonitor", "MonitorUsageError", "PortInUseError", "ReplayBackend", "Store", "StoreError", "TraceError",
    "TrainingMonitor", "UnavailableError", "XidEvent", "__version__", "add_note", "save_run", "take_fingerprint",
}


def test_all_is_pinned():
    assert set(gpulens.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(gpulens, name) is not None


def test_import_pulls_in_no_heavy_extra():
    code = "import sys, gpulens; print(sorted(m for m in ('torch', 'matplotlib', 'starlette', 'uvicorn', 'playwright') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
