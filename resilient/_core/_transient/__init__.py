"""
What is transient: one classifier says whether an error is worth another
try (retry) and whether it means the dependency is failing (breaker).

It knows the errors of the clients people call (httpx, requests and
urllib3, aiohttp, redis-py, psycopg and psycopg2, asyncpg) by the names of
their classes, without importing any of them: a class matches when its
top-level package and name appear anywhere in the exception's MRO, so
subclasses (`httpx.ReadTimeout` of `httpx.TimeoutException`) match too.
HTTP status errors are judged by their response's status code, database
errors by their SQLSTATE, and an exception group by its leaves.

Modules:

- `_tables`: what is transient, as data: the client libraries' transport
  errors and the subclasses never retried, SQLSTATEs, statuses,
  idempotent methods;
- `_kinds`: the recognisers of an exception's kind by its classes' names
  (cached per type) and of what it carries (SQLSTATE, HTTP status,
  request, certificate failure), and the leaves of exception groups;
- `_fields`: the classifiers' attrs converters, validators and reprs;
- `_classifiers`: `Transient`, `DependencyFailure` and what they share;
- `_inflight`: the HTTP request a cancellation cut short, from the client's
  frames in its traceback.
"""

from __future__ import annotations

from resilient._core._transient._classifiers import (
    DependencyFailure,
    Transient,
)
from resilient._core._transient._inflight import in_flight_request
from resilient._core._transient._kinds import every_leaf, http_status, leaves
from resilient._core._transient._tables import (
    DEFAULT_STATUSES,
    FAILURE_STATUSES,
    IDEMPOTENT_METHODS,
)


__all__ = [
    "DEFAULT_STATUSES",
    "FAILURE_STATUSES",
    "IDEMPOTENT_METHODS",
    "DependencyFailure",
    "Transient",
    "every_leaf",
    "http_status",
    "in_flight_request",
    "leaves",
]
