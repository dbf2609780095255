"""Hyper-parameter search entry points (``python tuning/gamma_search.py``)."""
