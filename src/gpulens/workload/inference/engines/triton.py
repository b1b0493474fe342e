"""NVIDIA Triton (metrics port 8002). Durations are cumulative microsecond counters, so the mean per
request between scrapes is Δduration / Δrequests; Triton exports no latency histogram by default."""

from gpulens.workload import names as N
from gpulens.workload.inference.engines.base import EngineMap

_REQUESTS = ("nv_inference_request_success", "nv_inference_request_failure")

TRITON = EngineMap(
    name="triton",
    prefix="nv_inference_",
    model_label="model",
    gauges=((("nv_inference_pending_request_count",), N.INFER_QUEUE_DEPTH, 1.0),),
    status_counters=(("nv_inference_request_success", "ok"), ("nv_inference_request_failure", "error")),
    mean_of_counters=(
        ("nv_inference_request_duration_us", _REQUESTS, 1e-6, N.INFER_LATENCY_SECONDS),
        ("nv_inference_queue_duration_us", _REQUESTS, 1e-6, N.INFER_QUEUE_WAIT_SECONDS),
        ("nv_inference_compute_infer_duration_us", _REQUESTS, 1e-6, N.INFER_SERVICE_SECONDS),
    ),
)
