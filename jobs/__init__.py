"""The contract shared by the API and the workers: job and event models, the one state
machine, errors, settings, input schemas, Redis key names."""
