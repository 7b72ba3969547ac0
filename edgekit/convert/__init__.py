"""The converter chain: one module per hop, each proving itself with a parity check."""
