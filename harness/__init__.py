"""Test-only pipelines and helpers to run real deployments in tests."""
