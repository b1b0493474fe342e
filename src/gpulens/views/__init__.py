"""The panel model: what each panel shows, read from a local store or from Prometheus.

Below the surfaces: the dashboard (gpulens.web), the reports (gpulens.report) and the Grafana export
(gpulens.export) import from here, never from each other.
"""
