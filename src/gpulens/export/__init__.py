"""Exporters: Prometheus exposition (the fleet path) and, in other modules, dashboards."""
