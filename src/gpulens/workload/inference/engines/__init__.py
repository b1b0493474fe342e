"""How each serving engine's Prometheus metrics map onto gpulens's inference series. One module
per engine; `ENGINES` lists them in detection order."""

from gpulens.workload.inference.engines.base import EngineMap
from gpulens.workload.inference.engines.sglang import SGLANG
from gpulens.workload.inference.engines.tgi import TGI
from gpulens.workload.inference.engines.triton import TRITON
from gpulens.workload.inference.engines.trtllm import TRTLLM
from gpulens.workload.inference.engines.vllm import VLLM

ENGINES: dict[str, EngineMap] = {e.name: e for e in (VLLM, SGLANG, TRTLLM, TGI, TRITON)}

__all__ = ["ENGINES", "SGLANG", "TGI", "TRITON", "TRTLLM", "VLLM", "EngineMap"]
