"""The service (layer 3): Ray Train loop, buffer actor, config, checkpoints, reports."""
