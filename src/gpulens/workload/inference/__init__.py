"""Inference metrics: the monitor and ASGI middleware a server uses on itself, scrapers for engines
that export Prometheus metrics (vLLM, TGI, Triton), and the importer of recorded requests."""

from gpulens.workload.inference.middleware import InferenceMiddleware, request_handle
from gpulens.workload.inference.monitor import InferenceMonitor, RequestHandle

__all__ = ["InferenceMiddleware", "InferenceMonitor", "RequestHandle", "request_handle"]
