"""ncdlr — novel class discovery on long-tailed data (Zhang et al., TMLR 2023) as a Ray service.

Layers (each free of the one above it):
  1. the method: ``prototypes``, ``ot``, ``buffer``, ``losses``, ``metrics``, ``estimate_k`` (pure torch/numpy);
  2. the data plane: ``ncdlr.data`` (manifests, builders, shards, object storage, Ray Data pipelines);
  3. the service: ``ncdlr.service`` (Ray Train loop, buffer actor, config, checkpoints, reports) and the CLI.
"""

__version__ = "0.1.0"
