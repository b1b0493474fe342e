"""Hugging Face text-generation-inference. Its counters have no `_total`; it has no TTFT metric.
`tgi_request_failure{err="overloaded"}` is a request refused because the queue was full: a
rejection, not an error."""

from gpulens.vocab import names as N
from gpulens.workload.inference.engines.base import EngineMap, Gauge, Histogram, Outcomes

TGI = EngineMap(
    name="tgi",
    prefix="tgi_",
    model_label=None,
    gauges=(
        Gauge(("tgi_queue_size",), N.INFER_QUEUE_DEPTH),
        Gauge(("tgi_batch_current_size",), N.INFER_BATCH_SIZE),
        Gauge(("tgi_batch_current_max_tokens",), N.INFER_BATCH_MAX_TOKENS),  # the running batch's token budget
    ),
    histograms=(
        Histogram(("tgi_request_duration",), N.INFER_LATENCY_SECONDS),
        Histogram(("tgi_request_queue_duration",), N.INFER_QUEUE_WAIT_SECONDS),
        Histogram(("tgi_request_inference_duration",), N.INFER_SERVICE_SECONDS),
        Histogram(("tgi_request_mean_time_per_token_duration",), N.INFER_TPOT_SECONDS),
        Histogram(("tgi_request_input_length",), N.INFER_REQUEST_PROMPT_TOKENS),
        Histogram(("tgi_request_generated_tokens",), N.INFER_REQUEST_OUTPUT_TOKENS),
    ),
    outcomes=(
        Outcomes("tgi_request_success"),
        Outcomes("tgi_request_failure", default="error", label="err", statuses=(("overloaded", "rejected"),)),
    ),
)
