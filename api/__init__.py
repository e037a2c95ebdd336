"""The FastAPI layer: validates, stores, enqueues, streams. Never imports model code."""
