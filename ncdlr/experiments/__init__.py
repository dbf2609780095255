"""Self-contained experiments runnable with ``python -m``."""
