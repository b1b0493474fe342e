"""NVIDIA Triton (metrics port 8002). Durations are cumulative microsecond counters, so the mean per
request between scrapes is Δduration / Δrequests; the mean batch size is Δinferences / Δexecutions.
Newer Triton labels failures with `reason`: REJECTED (queue full, timed out in the queue) is a
rejection, CANCELED an abort, BACKEND / OTHER an error. The first-response histogram (TTFT, in ms)
exists for decoupled models with `histogram_latencies` on. With the TensorRT-LLM backend, its
`nv_trt_llm_*` gauges give in-flight requests and KV-cache block use (its queue and batch
size come from Triton's own pending count and inference/execution counters)."""

from gpulens.vocab import names as N
from gpulens.workload.inference.engines.base import EngineMap, Gauge, Histogram, Outcomes, Ratio

_REQUESTS = ("nv_inference_request_success", "nv_inference_request_failure")
_TRT_REQ = "nv_trt_llm_request_metrics"
_TRT_KV = "nv_trt_llm_kv_cache_block_metrics"

TRITON = EngineMap(
    name="triton",
    prefix="nv_inference_",
    model_label="model",
    gauges=(
        Gauge(("nv_inference_pending_request_count",), N.INFER_QUEUE_DEPTH),
        Gauge((_TRT_REQ,), N.INFER_IN_FLIGHT, where=(("request_type", "active"),)),
        Gauge((_TRT_KV,), N.INFER_KV_CACHE_USAGE_RATIO, merge="mean", where=(("kv_cache_block_type", "fraction"),)),
    ),
    histograms=(Histogram(("nv_inference_first_response_histogram_ms",), N.INFER_TTFT_SECONDS, scale=1e-3),),
    outcomes=(
        Outcomes("nv_inference_request_success"),
        Outcomes("nv_inference_request_failure", default="error", label="reason",
                 statuses=(("rejected", "rejected"), ("canceled", "aborted"), ("cancelled", "aborted"))),
    ),
    ratios=(
        Ratio(("nv_inference_request_duration_us",), _REQUESTS, N.INFER_LATENCY_SECONDS, scale=1e-6),
        Ratio(("nv_inference_queue_duration_us",), _REQUESTS, N.INFER_QUEUE_WAIT_SECONDS, scale=1e-6),
        Ratio(("nv_inference_compute_infer_duration_us",), _REQUESTS, N.INFER_SERVICE_SECONDS, scale=1e-6),
        Ratio(("nv_inference_count",), ("nv_inference_exec_count",), N.INFER_BATCH_SIZE, as_mean=False),
    ),
)
