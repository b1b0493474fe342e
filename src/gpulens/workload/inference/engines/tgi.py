"""Hugging Face text-generation-inference. Its counters have no `_total`; it has no TTFT metric."""

from gpulens.workload import names as N
from gpulens.workload.inference.engines.base import EngineMap

TGI = EngineMap(
    name="tgi",
    prefix="tgi_",
    model_label=None,
    gauges=(
        (("tgi_queue_size",), N.INFER_QUEUE_DEPTH, 1.0),
        (("tgi_batch_current_size",), N.INFER_BATCH_SIZE, 1.0),
    ),
    histograms=(
        (("tgi_request_duration",), N.INFER_LATENCY_SECONDS),
        (("tgi_request_queue_duration",), N.INFER_QUEUE_WAIT_SECONDS),
        (("tgi_request_inference_duration",), N.INFER_SERVICE_SECONDS),
        (("tgi_request_mean_time_per_token_duration",), N.INFER_TPOT_SECONDS),
    ),
    status_counters=(("tgi_request_success", "ok"), ("tgi_request_failure", "error")),
)
