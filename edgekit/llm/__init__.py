"""Language models: sources, KV-cache exports, the generation workload and quality."""
