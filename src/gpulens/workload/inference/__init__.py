"""Inference metrics: the monitor and ASGI middleware a server uses on itself, scrapers for engines
that export Prometheus metrics (vLLM, TGI, Triton), and the importer of recorded requests."""

from gpulens.workload.inference.middleware import InferenceMiddleware, request_handle
from gpulens.workload.inference.monitor import InferenceMonitor, RequestHandle
from gpulens.workload.inference.records import RequestRecord, request_from_event, write_request

__all__ = [
    "InferenceMiddleware",
    "InferenceMonitor",
    "RequestHandle",
    "RequestRecord",
    "request_from_event",
    "request_handle",
    "write_request",
]
