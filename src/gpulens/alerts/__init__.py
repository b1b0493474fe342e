"""Baselines and alerts: thresholds learned from history, rule packs for GPU health, training and
inference, the pending → firing → resolved engine with silences and history, notifiers, and the
Prometheus rule export. The agent drives it through `gpulens.alerts.runtime.AlertRuntime`."""
