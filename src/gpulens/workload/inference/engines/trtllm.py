"""TensorRT-LLM's own metrics (`trtllm-serve`, or a Dynamo worker: `trtllm_` names; older
`trtllm-serve` wrote them without the prefix, which cannot be told from other servers and is not
detected). `request_success_total{finished_reason}`: stop / length are ok, cancelled is aborted,
timeout a timeout. The gauges and token counters appear in TRT-LLM 1.2+; Triton's TensorRT-LLM
backend (`nv_trt_llm_*`) is read by the Triton map."""

from gpulens.vocab import names as N
from gpulens.workload.inference.engines.base import Counter, EngineMap, Gauge, Histogram, Outcomes

TRTLLM = EngineMap(
    name="trtllm",
    prefix="trtllm_",
    model_label="model_name",
    gauges=(
        Gauge(("trtllm_num_requests_running",), N.INFER_IN_FLIGHT),
        Gauge(("trtllm_num_requests_waiting",), N.INFER_QUEUE_DEPTH),
        Gauge(("trtllm_kv_cache_utilization",), N.INFER_KV_CACHE_USAGE_RATIO, merge="mean"),
        Gauge(("trtllm_kv_cache_hit_rate",), N.INFER_PREFIX_CACHE_HIT_RATIO, merge="mean"),
    ),
    histograms=(
        Histogram(("trtllm_e2e_request_latency_seconds",), N.INFER_LATENCY_SECONDS),
        Histogram(("trtllm_time_to_first_token_seconds",), N.INFER_TTFT_SECONDS),
        Histogram(("trtllm_time_per_output_token_seconds",), N.INFER_TPOT_SECONDS),
        Histogram(("trtllm_request_queue_time_seconds",), N.INFER_QUEUE_WAIT_SECONDS),
        Histogram(("trtllm_request_inference_time_seconds",), N.INFER_SERVICE_SECONDS),
        Histogram(("trtllm_request_prefill_time_seconds",), N.INFER_PREFILL_SECONDS),
        Histogram(("trtllm_request_decode_time_seconds",), N.INFER_DECODE_SECONDS),
    ),
    counters=(
        Counter(("trtllm_prompt_tokens_total",), N.INFER_PROMPT_TOKENS_TOTAL),
        Counter(("trtllm_generation_tokens_total",), N.INFER_OUTPUT_TOKENS_TOTAL),
    ),
    outcomes=(
        Outcomes("trtllm_request_success_total", label="finished_reason",
                 statuses=(("cancelled", "aborted"), ("canceled", "aborted"), ("abort", "aborted"), ("timeout", "timeout"))),
        Outcomes("trtllm_num_aborted_requests_total", default="aborted"),  # added by Dynamo workers
    ),
)
