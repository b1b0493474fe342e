"""SGLang (`sglang:` names, 0.5.x collector). Scheduler gauges carry tp/pp/ep rank labels: counts
are summed over them, ratios averaged. Outcomes: `num_requests_total` (requests that finished
through the output path) is ok, `num_aborted_requests_total` (newer servers) is aborted. SGLang
counts an abort when one is asked for: a request aborted in the queue is only in the abort
counter, one aborted while running also finishes through the output path and is in both (so ok
can hold a few aborted requests; the two counters cannot be told apart further). A retraction
(a running request sent back to the queue for want of KV cache) is SGLang's preemption."""

from gpulens.vocab import names as N
from gpulens.workload.inference.engines.base import Counter, EngineMap, Gauge, Histogram, Outcomes

SGLANG = EngineMap(
    name="sglang",
    prefix="sglang:",
    model_label="model_name",
    gauges=(
        Gauge(("sglang:num_running_reqs",), N.INFER_IN_FLIGHT),
        Gauge(("sglang:num_queue_reqs",), N.INFER_QUEUE_DEPTH),
        Gauge(("sglang:token_usage",), N.INFER_KV_CACHE_USAGE_RATIO, merge="mean"),
        Gauge(("sglang:cache_hit_rate",), N.INFER_PREFIX_CACHE_HIT_RATIO, merge="mean"),
    ),
    histograms=(
        Histogram(("sglang:e2e_request_latency_seconds",), N.INFER_LATENCY_SECONDS),
        Histogram(("sglang:time_to_first_token_seconds",), N.INFER_TTFT_SECONDS),
        Histogram(("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"), N.INFER_ITL_SECONDS),
        Histogram(("sglang:request_time_per_output_token_seconds",), N.INFER_TPOT_SECONDS),
        Histogram(("sglang:queue_time_seconds",), N.INFER_QUEUE_WAIT_SECONDS),
        Histogram(("sglang:prompt_tokens_histogram",), N.INFER_REQUEST_PROMPT_TOKENS),
        Histogram(("sglang:generation_tokens_histogram",), N.INFER_REQUEST_OUTPUT_TOKENS),
    ),
    counters=(
        Counter(("sglang:prompt_tokens_total",), N.INFER_PROMPT_TOKENS_TOTAL),
        Counter(("sglang:generation_tokens_total",), N.INFER_OUTPUT_TOKENS_TOTAL),
        Counter(("sglang:num_retracted_requests_total",), N.INFER_PREEMPTIONS_TOTAL),
    ),
    outcomes=(
        Outcomes("sglang:num_requests_total"),
        Outcomes("sglang:num_aborted_requests_total", default="aborted"),
    ),
)
