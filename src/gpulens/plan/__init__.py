"""The planner: GPU memory, speed and cost of training or serving a model; pure functions that
touch no hardware. Start with `plan(PlanRequest(model="llama-3-8b", workload="train", gpu="h100-sxm"))`."""

from gpulens.plan.catalog import GpuSpec, UnknownGpuError, UnsupportedPrecisionError, all_gpus, find_gpu
from gpulens.plan.memory import MemoryEstimate, TrainSetup, training_memory
from gpulens.plan.models import ModelSpec, from_hf_config, load_model, preset, preset_names
from gpulens.plan.planner import Comparison, PlanRequest, PlanResult, compare, plan
from gpulens.plan.request import PlanOptions
from gpulens.plan.serve import ServeSetup, plan_serving
from gpulens.plan.speculative import SpeculativeSetup, expected_tokens_per_step
from gpulens.plan.speed import Efficiency, training_speed

__all__ = [
    "Comparison",
    "Efficiency",
    "GpuSpec",
    "MemoryEstimate",
    "ModelSpec",
    "PlanOptions",
    "PlanRequest",
    "PlanResult",
    "ServeSetup",
    "SpeculativeSetup",
    "TrainSetup",
    "UnknownGpuError",
    "UnsupportedPrecisionError",
    "all_gpus",
    "compare",
    "expected_tokens_per_step",
    "find_gpu",
    "from_hf_config",
    "load_model",
    "plan",
    "plan_serving",
    "preset",
    "preset_names",
    "training_memory",
    "training_speed",
]
