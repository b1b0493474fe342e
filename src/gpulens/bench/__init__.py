"""Benchmarks that measure: the serving load tester (`bench.serve`) and, beside it, training ones."""
