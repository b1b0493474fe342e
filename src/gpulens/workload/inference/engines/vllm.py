"""vLLM (V1 names, and the V0 names older servers export). `*_perc` gauges are ratios 0–1."""

from gpulens.workload import names as N
from gpulens.workload.inference.engines.base import EngineMap

VLLM = EngineMap(
    name="vllm",
    prefix="vllm:",
    model_label="model_name",
    gauges=(
        (("vllm:num_requests_running",), N.INFER_IN_FLIGHT, 1.0),
        (("vllm:num_requests_waiting",), N.INFER_QUEUE_DEPTH, 1.0),
        (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), N.INFER_KV_CACHE_USAGE_RATIO, 1.0),
    ),
    histograms=(
        (("vllm:e2e_request_latency_seconds",), N.INFER_LATENCY_SECONDS),
        (("vllm:time_to_first_token_seconds",), N.INFER_TTFT_SECONDS),
        (("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), N.INFER_ITL_SECONDS),
        (("vllm:request_time_per_output_token_seconds",), N.INFER_TPOT_SECONDS),
        (("vllm:request_queue_time_seconds",), N.INFER_QUEUE_WAIT_SECONDS),
    ),
    status_counters=(("vllm:request_success_total", "ok"),),
)
