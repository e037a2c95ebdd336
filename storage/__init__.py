"""Artifact storage: job inputs (uploads) and outputs in a local directory or on S3.

`make_storage(settings)` builds the configured backend; `storage.base` holds the
interface and the key rules, `storage.refs` and `storage.fetch` resolve the file
references in job inputs.
"""
