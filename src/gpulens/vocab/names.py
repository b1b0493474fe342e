"""Series and event names of workload metrics, shared by the sources (monitors, importers, scrapers)
and the consumers (rules, diagnosis, dashboard, exporter). Base units in the names.

Training series carry labels `train_job`, `rank`, `host` (not `job`: a Prometheus scrape owns that
name and would rename ours to `exported_job`); inference series carry `service`, `model`, `host`.
"""

# The label that names a training job in the store, in /metrics, in rules and in dashboards.
TRAIN_JOB_LABEL = "train_job"

# ---- training: one sample per step, at the step's end time
TRAIN_STEP_SECONDS = "train_step_seconds"
TRAIN_DATA_WAIT_SECONDS = "train_data_wait_seconds"
TRAIN_COMPUTE_SECONDS = "train_compute_seconds"
TRAIN_COMM_WAIT_SECONDS = "train_comm_wait_seconds"
TRAIN_CHECKPOINT_SECONDS = "train_checkpoint_seconds"
TRAIN_EVAL_SECONDS = "train_eval_seconds"  # one sample per evaluation run (between steps, not part of one)
TRAIN_DATA_WAIT_RATIO = "train_data_wait_ratio"  # data wait / step time
TRAIN_COMM_WAIT_RATIO = "train_comm_wait_ratio"
TRAIN_SAMPLES_PER_SECOND = "train_samples_per_second"
TRAIN_TOKENS_PER_SECOND = "train_tokens_per_second"
TRAIN_MFU_RATIO = "train_mfu_ratio"
TRAIN_MEMORY_ALLOCATED_BYTES = "train_memory_allocated_bytes"
TRAIN_MEMORY_PEAK_BYTES = "train_memory_peak_bytes"
TRAIN_MEMORY_RESERVED_BYTES = "train_memory_reserved_bytes"
TRAIN_LOSS = "train_loss"
TRAIN_LOSS_SCALE = "train_loss_scale"
TRAIN_BATCH_SIZE = "train_batch_size"

# ---- which process ran each rank: an info gauge (value 1) the agent exports from the rank's
# `train_start` event while the rank's steps are fresh, so a fleet's Prometheus can join a GPU's
# series to the ranks on it (labels train_job, rank, host, pid, cuda_device). Not a store series.
RANK_INFO = "train_rank_info"
PID_LABEL = "pid"
CUDA_DEVICE_LABEL = "cuda_device"  # the CUDA index the rank reported (remapped by CUDA_VISIBLE_DEVICES)

# ---- training events (Store.event kinds)
EV_TRAIN_STEP = "train_step"  # data: the whole step record (incl. pid, rank)
EV_TRAIN_OOM = "train_oom"  # data: allocated/reserved/largest free block bytes, message
EV_TRAIN_NAN = "train_nan_loss"
EV_TRAIN_STEP_OUTLIER = "train_step_outlier"
EV_TRAIN_START = "train_start"  # data: pid, rank, world_size, config
EV_TRAIN_EVAL = "train_eval"  # data: seconds, after_step, pid, rank

# ---- inference: one sample per request at its end time, unless noted
INFER_LATENCY_SECONDS = "infer_request_latency_seconds"  # from arrival (or intended send) to end
INFER_SERVICE_SECONDS = "infer_service_seconds"  # from start of processing to end
INFER_QUEUE_WAIT_SECONDS = "infer_queue_wait_seconds"
INFER_TTFT_SECONDS = "infer_ttft_seconds"
INFER_TPOT_SECONDS = "infer_tpot_seconds"
INFER_ITL_SECONDS = "infer_itl_seconds"
INFER_OUTPUT_TOKENS = "infer_output_tokens"
INFER_PROMPT_TOKENS = "infer_prompt_tokens"
INFER_BATCH_SIZE = "infer_batch_size"
INFER_IN_FLIGHT = "infer_in_flight"  # gauge
INFER_QUEUE_DEPTH = "infer_queue_depth"  # gauge
INFER_REQUESTS_TOTAL = "infer_requests_total"  # counter, label status=ok|error|timeout|rejected|aborted
# Every documented value of that `status` label. The exporter writes each one (0 until it happens) for
# every label set that has served a request, so `rate(...{status="error"}[5m])` is 0, not empty.
REQUEST_STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "rejected", "aborted")
# The series a monitor counts in its own process (several workers of one service each count their
# own): stored with a `pid` label, so each stays monotonic; readers sum over it, the exporter folds it out.
PER_PROCESS_SERIES = frozenset({INFER_IN_FLIGHT, INFER_REQUESTS_TOTAL})
# ---- inference, read from serving engines by `--scrape` (label `source`)
INFER_PREFILL_SECONDS = "infer_prefill_seconds"  # a request's prefill phase
INFER_DECODE_SECONDS = "infer_decode_seconds"  # a request's decode phase
INFER_REQUEST_PROMPT_TOKENS = "infer_request_prompt_tokens"  # distribution of prompt length per request
INFER_REQUEST_OUTPUT_TOKENS = "infer_request_output_tokens"  # distribution of output length per request
INFER_PROMPT_TOKENS_TOTAL = "infer_prompt_tokens_total"  # counter: prompt tokens processed
INFER_OUTPUT_TOKENS_TOTAL = "infer_output_tokens_total"  # counter: tokens generated
INFER_PREEMPTIONS_TOTAL = "infer_preemptions_total"  # counter: running requests preempted (SGLang: retracted)
INFER_PREFIX_CACHE_HIT_RATIO = "infer_prefix_cache_hit_ratio"  # gauge: prompt tokens found in the prefix cache
INFER_BATCH_MAX_TOKENS = "infer_batch_max_tokens"  # gauge: the running batch's token budget (TGI)
INFER_KV_CACHE_USAGE_RATIO = "infer_kv_cache_usage_ratio"
INFER_MEMORY_ALLOCATED_BYTES = "infer_memory_allocated_bytes"
INFER_MEMORY_RESERVED_BYTES = "infer_memory_reserved_bytes"
INFER_COLD_START_SECONDS = "infer_cold_start_seconds"  # one sample per model load

# ---- inference events
EV_REQUEST = "request"  # data: arrival/intended, start, first_token, end, status, tokens, pid
EV_COLD_START = "cold_start"
EV_INFER_START = "infer_start"  # data: pid, service, model
EV_ENGINE_STATS = "engine_stats"  # a recorded engine reading: t, service, engine, model, its own gauges and counters
# A record a live monitor sends its node's agent (workload.wire), stored as series only: the monitor's
# gauges at one moment (in_flight, queue_depth, memory_allocated_bytes, memory_reserved_bytes, kv_cache_usage_ratio).
REC_INFER_GAUGES = "infer_gauges"

# ---- distributions: per-event series exported to Prometheus as histograms (`_bucket`, `_sum`,
# `_count`), so `histogram_quantile` gives a right percentile over any window and any aggregation.
# Buckets (upper bounds in the series' unit, seconds or tokens; +Inf is implied) are chosen per quantity: roughly 1-2-5 steps
# over the range where that quantity lives, denser where service objectives are usually set, and a
# doubling tail up to the tops vLLM's own histograms use (request 7680 s, TTFT 2560 s, TPOT/ITL 80 s):
# a long LLM request or a slow checkpoint lands in a finite bucket, so histogram_quantile still
# interpolates instead of reporting the highest finite bound.
LATENCY_BUCKETS_SECONDS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
    7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 3840.0, 7680.0,
)  # a whole request: 5 ms .. 7680 s (~2 h, vLLM's e2e top)
TOKEN_BUCKETS_SECONDS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # one output token (TPOT, inter-token latency): 1 ms .. 80 s (vLLM's top)
FIRST_TOKEN_BUCKETS_SECONDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 20.0, 30.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0,
)  # TTFT and queue wait: 1 ms .. 2560 s (~43 min, vLLM's TTFT top)
STEP_BUCKETS_SECONDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
)  # a training step and its parts: 1 ms .. 1 h (a long job's step, a large checkpoint)
TOKEN_COUNT_BUCKETS = (
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
    32768.0, 65536.0, 131072.0,
)  # tokens in one request (prompt or output): 1 .. 128 Ki, powers of two
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    INFER_LATENCY_SECONDS: LATENCY_BUCKETS_SECONDS,
    INFER_SERVICE_SECONDS: LATENCY_BUCKETS_SECONDS,
    INFER_QUEUE_WAIT_SECONDS: FIRST_TOKEN_BUCKETS_SECONDS,
    INFER_TTFT_SECONDS: FIRST_TOKEN_BUCKETS_SECONDS,
    INFER_TPOT_SECONDS: TOKEN_BUCKETS_SECONDS,
    INFER_ITL_SECONDS: TOKEN_BUCKETS_SECONDS,
    INFER_PREFILL_SECONDS: LATENCY_BUCKETS_SECONDS,
    INFER_DECODE_SECONDS: LATENCY_BUCKETS_SECONDS,
    INFER_REQUEST_PROMPT_TOKENS: TOKEN_COUNT_BUCKETS,
    INFER_REQUEST_OUTPUT_TOKENS: TOKEN_COUNT_BUCKETS,
    TRAIN_STEP_SECONDS: STEP_BUCKETS_SECONDS,
    TRAIN_DATA_WAIT_SECONDS: STEP_BUCKETS_SECONDS,
    TRAIN_COMPUTE_SECONDS: STEP_BUCKETS_SECONDS,
    TRAIN_COMM_WAIT_SECONDS: STEP_BUCKETS_SECONDS,
    TRAIN_CHECKPOINT_SECONDS: STEP_BUCKETS_SECONDS,
    TRAIN_EVAL_SECONDS: STEP_BUCKETS_SECONDS,
}
# An engine's mean per request between two scrapes, where the engine gives durations as counters
# (Triton's cumulative microseconds: no buckets to pass through). The store keeps it under the
# histogram's name with quantile="mean"; /metrics exports it as a gauge of its own name, since a
# histogram family cannot carry a gauge sample.
INFER_LATENCY_MEAN_SECONDS = "infer_request_latency_mean_seconds"
INFER_QUEUE_WAIT_MEAN_SECONDS = "infer_queue_wait_mean_seconds"
INFER_SERVICE_MEAN_SECONDS = "infer_service_mean_seconds"
ENGINE_MEAN_SERIES: dict[str, str] = {
    INFER_LATENCY_SECONDS: INFER_LATENCY_MEAN_SECONDS,
    INFER_QUEUE_WAIT_SECONDS: INFER_QUEUE_WAIT_MEAN_SECONDS,
    INFER_SERVICE_SECONDS: INFER_SERVICE_MEAN_SECONDS,
}
# Counters among the workload series (typed `counter` on /metrics in both naming modes). Only
# infer_requests_total is also written per request by gpulens's own monitors (one sample a request);
# the others come from engines as their cumulative value.
WORKLOAD_COUNTERS = frozenset({INFER_REQUESTS_TOTAL, INFER_PROMPT_TOKENS_TOTAL, INFER_OUTPUT_TOKENS_TOTAL,
                               INFER_PREEMPTIONS_TOTAL})
