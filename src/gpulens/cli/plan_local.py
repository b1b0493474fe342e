"""`gpulens plan --gpu local`: plan for the GPU in this machine.

The GPU seam (gpulens.gpu) and the planner's catalog (gpulens.plan) share a layer and import neither
each other, so the CLI joins them: the name NVML reports for this machine's GPUs, looked up among the
catalog's `nvml_names` (the same lookup as `--gpu "NVIDIA H200"`). `GPULENS_BACKEND` picks another
backend, as for every command that reads GPUs (`replay`: the bundled H200 session's card)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpulens.errors import BackendUnavailableError, BadInputError, shown

LOCAL_GPU_NAMES = ("local", "this")


@dataclass(frozen=True)
class LocalGpu:
    catalog_name: str
    nvml_name: str
    count: int
    note: str | None  # what the plan should say about the match, if anything


def is_local(name: str | None) -> bool:
    return name is not None and name.strip().lower() in LOCAL_GPU_NAMES


def local_gpu() -> LocalGpu:
    """The catalog card this machine's GPUs are; one sentence (exit 3) without a driver, (exit 2) for
    a machine with two kinds of card or a card the catalog does not hold."""
    from gpulens.gpu import open_backend
    from gpulens.plan.catalog import card_for_nvml

    try:
        backend = open_backend(os.environ.get("GPULENS_BACKEND") or None, speed=None)
    except BackendUnavailableError as e:  # its hint names --backend, which plan has not
        raise BackendUnavailableError(f"--gpu local has no card to plan for: {e.message[:1].lower()}{e.message[1:]}",
                                      hint="Name a card with --gpu (gpulens plan gpus lists them), or set "
                                           "GPULENS_BACKEND=replay for the bundled H200 session's card.") from None
    try:
        gpus = backend.gpus()
        mig = any(s.mig_mode for s in backend.sample())
    finally:
        backend.close()
    if not gpus:
        raise BackendUnavailableError("The GPU backend lists no GPU on this machine, so --gpu local names none.",
                                      hint="Name a card with --gpu, e.g. --gpu h100-sxm (gpulens plan gpus lists them).")
    kinds = sorted({g.name for g in gpus})
    if len(kinds) > 1:
        raise BadInputError(f"This machine holds {len(kinds)} kinds of GPU ({', '.join(shown(k) for k in kinds)}), "
                            "so --gpu local does not say which to plan for.", hint=f"Name one with --gpu {shown(kinds[0])}.")
    name = kinds[0]
    match = card_for_nvml(name, gpus[0].memory_total_bytes)
    if match.card is None:
        raise BadInputError(f"This machine's GPU, {shown(name)}, is not in gpulens's catalog.",
                            hint=f"Add it to your plan config with memory_gb, bandwidth_gbps, bf16_tflops and "
                                 f"nvml_names: [{shown(name)}] (docs/plan.md, 'Your cards and prices'), or name a "
                                 "catalog card with --gpu.")
    note = match.memory_note
    if mig:  # a workload gets one instance's memory and SMs, not the card's
        note = ((note + " ") if note else "") + (
            "The GPU is in MIG mode: this plan is for the whole card, not one instance. Add the instance to your "
            "plan config as a card of its own (its memory_gb, and the card's figures scaled by its share of SMs) "
            "to plan for it.")
    return LocalGpu(match.card.name, name, len(gpus), note)
