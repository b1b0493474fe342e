"""The node's live `/metrics`: the agent's latest GPU readings and the store's workload series as
Prometheus families (custom collectors, fresh per scrape), health and readiness, and the desired-replica
signal. It belongs with the node (pipeline/ wires it in); the Grafana file is a surface (export/)."""
