"""API routers, one module per area."""
