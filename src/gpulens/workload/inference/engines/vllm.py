"""vLLM (V1 names, and the V0 names older servers export). `*_perc` gauges are ratios 0–1.
`request_success_total{finished_reason}` counts every finished request: stop and length are ok,
abort is aborted (the client went away or the server cancelled it), error is error."""

from gpulens.vocab import names as N
from gpulens.workload.inference.engines.base import Counter, EngineMap, Gauge, Histogram, Outcomes, Ratio

VLLM = EngineMap(
    name="vllm",
    prefix="vllm:",
    model_label="model_name",
    gauges=(
        Gauge(("vllm:num_requests_running",), N.INFER_IN_FLIGHT),
        Gauge(("vllm:num_requests_waiting",), N.INFER_QUEUE_DEPTH),
        Gauge(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), N.INFER_KV_CACHE_USAGE_RATIO, merge="mean"),
    ),
    histograms=(
        Histogram(("vllm:e2e_request_latency_seconds",), N.INFER_LATENCY_SECONDS),
        Histogram(("vllm:time_to_first_token_seconds",), N.INFER_TTFT_SECONDS),
        Histogram(("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), N.INFER_ITL_SECONDS),
        Histogram(("vllm:request_time_per_output_token_seconds",), N.INFER_TPOT_SECONDS),
        Histogram(("vllm:request_queue_time_seconds",), N.INFER_QUEUE_WAIT_SECONDS),
        Histogram(("vllm:request_inference_time_seconds",), N.INFER_SERVICE_SECONDS),
        Histogram(("vllm:request_prefill_time_seconds",), N.INFER_PREFILL_SECONDS),
        Histogram(("vllm:request_decode_time_seconds",), N.INFER_DECODE_SECONDS),
        Histogram(("vllm:request_prompt_tokens",), N.INFER_REQUEST_PROMPT_TOKENS),
        Histogram(("vllm:request_generation_tokens",), N.INFER_REQUEST_OUTPUT_TOKENS),
    ),
    counters=(
        Counter(("vllm:prompt_tokens_total",), N.INFER_PROMPT_TOKENS_TOTAL),
        Counter(("vllm:generation_tokens_total",), N.INFER_OUTPUT_TOKENS_TOTAL),
        Counter(("vllm:num_preemptions_total",), N.INFER_PREEMPTIONS_TOTAL),
    ),
    outcomes=(
        Outcomes("vllm:request_success_total", label="finished_reason",
                 statuses=(("abort", "aborted"), ("error", "error"))),
    ),
    ratios=(  # prefix-cache hits and queries count tokens (V1; 0.7-0.10 had the gpu_ prefix)
        Ratio(("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
              ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
              N.INFER_PREFIX_CACHE_HIT_RATIO, as_mean=False),
    ),
)
