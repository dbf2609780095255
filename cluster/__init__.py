"""Cluster launch files (config.yaml, kuberay/) and `simulate.py`, the one-machine multi-node check."""
