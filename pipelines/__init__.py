"""Pipelines: one per kind, each wrapping a real model library behind `pipelines.base`."""
