"""The Redis job store: jobs and their changes (one Lua transition script), events,
leases, batches, quotas."""
