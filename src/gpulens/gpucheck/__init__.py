"""`make gpu-check` (`python -m gpulens.gpucheck`): the checks that only a machine with an NVIDIA GPU
can run, prepared so that one run gives one JSON report. Every NVML field the backend reads against
`nvidia-smi --query-gpu` over 30 s (idle, then under load), GPM fields, XID event registration, the
training monitor on a real CUDA loop (its overhead against the bare loop, its CUDA-event timings) and
a real out-of-memory error inside `mon.step()` (the allocator numbers it recorded). On a machine
without a driver it says so and exits 0."""
