"""The contract shared by the API and the workers: jobs, events, schemas, settings, store."""
