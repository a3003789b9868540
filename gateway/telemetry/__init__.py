"""What the gateway reports about itself: Prometheus metrics, the usage ledger's writer counters, and rejected requests into the rejection log."""
