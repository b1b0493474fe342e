"""MFU (model FLOPs utilization) as gpulens shows it everywhere: a value above 100 % of the peak
cannot happen, so it is never printed plain; it names the likely cause instead."""

from __future__ import annotations

MFU_IMPOSSIBLE = ("above 100 % of the peak is impossible: the FLOPs per token (parameter count) or the "
                  "peak FLOP/s it was computed with is wrong")


def mfu_is_impossible(ratio: float | None) -> bool:
    return ratio is not None and ratio > 1.0


def format_mfu(ratio: float, digits: int = 0) -> str:
    """"42 %"-style text ("{:.0%}"), or the value with why it cannot be right."""
    text = f"{ratio:.{digits}%}"
    return f"{text} (impossible: {MFU_IMPOSSIBLE.split(': ', 1)[1]})" if mfu_is_impossible(ratio) else text
