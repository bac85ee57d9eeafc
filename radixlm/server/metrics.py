"""Prometheus metrics (placeholder until written)."""
