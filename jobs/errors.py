"""Domain errors shared by the API and the workers.

```
MmqError
 ├── NotFound             the job (or file) does not exist for this owner      -> 404
 ├── InputError           a field breaks a rule; names the field and reason   -> 422
 │    └── TooLarge        a body or file over its size limit                   -> 413
 ├── QueueFull            admission control refused; carries retry_after_s    -> 429
 ├── Conflict             the request contradicts the job's state             -> 409
 ├── Unauthorized         missing or unknown API key                           -> 401
 ├── Forbidden            a known key that may not do this (not an admin key)  -> 403
 └── Unavailable          a dependency is down (Redis, broker)                 -> 503
      └── NotDurable      written, but not confirmed at redis.durability       -> 503
```

Workers raise `InputError` for input that only the model can judge (undecodable audio):
the job fails with the reason and is never retried.
"""

from __future__ import annotations


class MmqError(Exception):
    """Base class of every mmq error."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(MmqError):
    code = "not_found"


class InputError(MmqError):
    code = "invalid_input"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class TooLarge(InputError):
    code = "too_large"


class QueueFull(MmqError):
    code = "queue_full"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(QueueFull):
    """Over one of the key's quotas (`jobstore.quotas`): 429, naming the quota."""

    code = "quota_exceeded"

    def __init__(self, message: str, retry_after_s: int, quota: str) -> None:
        super().__init__(message, retry_after_s)
        self.quota = quota


class Conflict(MmqError):
    code = "conflict"


class Unauthorized(MmqError):
    code = "unauthorized"


class Forbidden(MmqError):
    code = "forbidden"


class Unavailable(MmqError):
    code = "unavailable"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotDurable(Unavailable):
    """Redis took the write but did not confirm it at the configured durability level
    in time: the caller must not treat it as accepted (or acknowledged)."""

    code = "not_durable"
