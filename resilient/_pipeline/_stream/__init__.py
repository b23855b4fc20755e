"""
Streams: generator functions and async generator functions under a policy,
a breaker or a bulkhead.

A call of a plain function ends when it returns; a stream's call ends when
its consumer stops iterating. So a decorated generator function becomes a
generator function of the same colour whose generator, from its first
``next`` on:

- is admitted once (breaker, bulkhead) and holds its tickets until the
  stream ends: exhausted, raising, closed (``close()``, ``aclose()``, a
  ``break`` that drops it, garbage collection) or cancelled; they are
  settled exactly once, on whichever way out comes first;
- under a policy, runs the policy's flow (`resilient._pipeline._flow`) up
  to the first item: an attempt is "make the generator and get its first
  item", so an error before the first item is retried like any failed
  attempt, and the first item ends the retrying; the attempt's span ends
  there, the call's span when the stream ends;
- after the first item, delegates as ``yield from`` does (``send``,
  ``throw``, ``athrow`` and ``close`` reach the inner generator, its return
  value is the stream's), each step with the context the stream needs (the
  item deadline) set and reset around it, never across a ``yield`` (the
  consumer's context is the stream's between steps);
- raises an error after the first item as it is, with a note when the
  policy would have retried it: nothing can be restarted once items were
  delivered.

Time: the policy's *budget* bounds getting the stream started (its
attempts and waits, up to the first item); its *timeout* bounds each item
(the first one, as an attempt, and every later one: a stream that stalls
longer raises `DeadlineExceeded`). Enclosing deadlines bound every step.

What the breaker counts: an error raised while iterating as the breaker's
configuration says, a success when the stream is exhausted or its consumer
closes it; a cancellation or an interrupt never.

Modules:

- `_drive`: the two drivers (sync, async), the delegation of PEP 380 one
  step at a time, over a session that admits, steps and ends the stream;
- `_policy`: the session of a stream through a policy (its flow up to the
  first item, then its tickets and span);
- `_held`: the session of a stream through a standalone breaker or
  bulkhead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resilient._pipeline._stream._drive import async_stream, sync_stream
from resilient._pipeline._stream._held import (
    BreakerHold,
    BulkheadHold,
    HeldStream,
)
from resilient._pipeline._stream._policy import PolicyStream
from resilient.exceptions import ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._breaker import CircuitBreaker
    from resilient._bulkhead import Bulkhead
    from resilient._core._decorate import StreamShell
    from resilient._core._settings import RetrySettings
    from resilient._pipeline._guards import Guards
    from resilient._pipeline._stream._held import Hold


def policy_streams(
    policy: RetrySettings, guards: Guards | None
) -> StreamShell:
    """How ``@policy`` wraps a generator function (see the module)."""

    def make(fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        _refuse(policy, fn)
        return _wrap(fn, is_async, lambda: PolicyStream(policy, guards))

    return make


def breaker_streams(breaker: CircuitBreaker) -> StreamShell:
    """How ``@breaker`` wraps a generator function: admitted at its first
    ``next``, counted when it ends."""
    return _held(BreakerHold(breaker))


def bulkhead_streams(bulkhead: Bulkhead) -> StreamShell:
    """How ``@bulkhead`` wraps a generator function: a slot from its first
    ``next`` until it ends."""
    return _held(BulkheadHold(bulkhead))


def _held(hold: Hold) -> StreamShell:
    def make(fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        return _wrap(fn, is_async, lambda: HeldStream(hold))

    return make


def _refuse(policy: RetrySettings, fn: object) -> None:
    """The policy settings a stream cannot honour, refused at decoration."""
    if policy.retry_if_result is not None:
        raise ConfigTypeError(
            "Policy.retry_if_result",
            policy.retry_if_result,
            f"of policy {policy.name!r} judges a returned value, and "
            f"{fn!r} is a generator function whose items are not retried: "
            "raise from the generator to retry before its first item",
        )
    if policy.fallback is not None:
        raise ConfigTypeError(
            "Policy.fallback",
            policy.fallback,
            f"of policy {policy.name!r} returns a value, which cannot "
            f"replace the stream of generator function {fn!r}: catch the "
            "error around the loop that consumes it",
        )


def _wrap(
    fn: Callable[..., Any], is_async: bool, session: Callable[[], Any]
) -> Callable[..., Any]:
    """The guarded generator function of *fn*'s colour."""
    return (async_stream if is_async else sync_stream)(fn, session)
