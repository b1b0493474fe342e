"""Kubernetes: which pod holds which GPU (the kubelet's pod-resources API)."""
