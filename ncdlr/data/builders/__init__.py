"""Dataset builders: one module per source dataset, each producing records for ``ncdlr.data.shards``."""
