"""Host side of the agent protocol: ship the bundle, send a request, parse the one JSON report."""
