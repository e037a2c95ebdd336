"""The Celery glue: the app on the Redis broker, its queues, and kombu's Redis layout."""
