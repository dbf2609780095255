"""The data plane (layer 2): manifests, builders, shards, object storage, Ray Data pipelines. Knows nothing of the model."""
