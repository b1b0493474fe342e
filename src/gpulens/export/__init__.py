"""Surfaces that write files for other tools: the Grafana dashboard JSON (built from the panel model in views/)."""
