"""Workload sources: the training monitor, the inference middleware/monitor, engine scrapers,
framework callbacks, and the importers that turn recorded workload events into series."""
