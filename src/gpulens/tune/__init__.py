"""`gpulens tune`: the tuning loop the guides describe, run for the user (baseline, find the
bottleneck, change one thing, re-measure, keep or roll back, with statistics and a record)."""
