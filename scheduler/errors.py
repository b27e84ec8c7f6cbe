"""The one error tree of raftcron's domain and API.

Every class carries the HTTP status it is answered with and a stable ``code``
that scripts may match on. Messages name the thing they are about
(``no job named 'x'``). Foreign failures (pysyncobj fail reasons, msgpack,
croniter, aiohttp) are translated into these where they enter, chained with
``from exc``.

    RaftcronError                 500 internal
    ├── ValidationFailed          400 invalid          (details: field path + message)
    ├── Unauthorized              401 unauthorized
    ├── Forbidden                 403 forbidden
    ├── NotFound                  404 not_found
    ├── Conflict                  409 conflict
    ├── PayloadTooLarge           413 payload_too_large
    ├── Unavailable               503 unavailable      (no leader, election, quorum lost)
    ├── OutcomeUnknown            504 outcome_unknown  (submitted, commit not confirmed in time)
    └── InsufficientStorage       507 insufficient_storage (this node's data directory is nearly full)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RaftcronError",
    "ValidationFailed",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "Unavailable",
    "OutcomeUnknown",
    "InsufficientStorage",
    "FieldError",
]

FieldError = dict[str, str]  # {"field": "http.url", "message": "is required"}


class RaftcronError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, details: list[Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: list[Any] = list(details or [])

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class ValidationFailed(RaftcronError):
    status = 400
    code = "invalid"

    def __init__(self, details: list[FieldError], message: str | None = None) -> None:
        if message is None:
            message = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid input"
        super().__init__(message, details)


class Unauthorized(RaftcronError):
    status = 401
    code = "unauthorized"


class Forbidden(RaftcronError):
    status = 403
    code = "forbidden"


class NotFound(RaftcronError):
    status = 404
    code = "not_found"


class Conflict(RaftcronError):
    status = 409
    code = "conflict"


class PayloadTooLarge(RaftcronError):
    status = 413
    code = "payload_too_large"


class Unavailable(RaftcronError):
    """No leader can commit right now; the client should retry after ``retry_after`` seconds."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OutcomeUnknown(RaftcronError):
    """The write was handed to Raft but its commit was not confirmed in time.

    Every write is idempotent (jobs by name and version, claims by slot), so
    repeating it is safe.
    """

    status = 504
    code = "outcome_unknown"


class InsufficientStorage(RaftcronError):
    """The node's data directory has less free space than the journal needs; the write was
    not proposed. Nothing already acknowledged is lost; free space and repeat."""

    status = 507
    code = "insufficient_storage"
