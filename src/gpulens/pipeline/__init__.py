"""One sampling pipeline for every door: the loop, its sinks, and `build_node`.

    gpu backend ─▶ SamplingLoop ─▶ sinks (store, /metrics readings, recording, view, co-location,
                                          alert rules, engine scrapers, a trace's workload events)
"""

from gpulens.pipeline.loop import Frame, LoopStats, SamplingLoop, Sink, StopEvent
from gpulens.pipeline.node import AlertsConfig, Node, NodeConfig, build_node

__all__ = ["AlertsConfig", "Frame", "LoopStats", "Node", "NodeConfig", "SamplingLoop", "Sink", "StopEvent", "build_node"]
