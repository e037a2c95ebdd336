"""Metrics every process writes into Redis, and the overview's per-minute counts."""
