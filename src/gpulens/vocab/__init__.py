"""The words every package shares, at the bottom of the layers: it imports nothing of theirs.

- `names`: workload series and event names, label names, histogram buckets
- `gpu`: GPU series names, their `GpuSample` fields and dcgm-exporter's names for them
- `gpu_fields`: the `GpuSample` attributes that carry a reading, by name
- `xid`: NVIDIA's XID catalog (meaning, action, severity)
- `directions`: which way is better for each metric, and its unit
- `slo`: the latency-objective grammar (`p99_latency<=500ms`)
- `time`: points and windows of time as a user types them

Feature packages spell a metric, label or field name only through these constants, so a rename is one
edit and a typo is an import error (tests/foundation/test_vocabulary.py holds it).
"""
