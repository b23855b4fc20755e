"""
Sync forms of a policy on an event loop's thread, refused at their first
call.

A sync retry blocks the thread it runs in while it waits (the backoff, a
server's hint, an open breaker, a bulkhead's queue); on a thread that runs
an event loop that stalls every task of the loop, so the wait itself asks
`resilient._core._loops.refuse_blocking` and raises. That alone leaves the
mistake hidden until the first failure: a sync-decorated function called
from a coroutine passes every test in which it succeeds, and the first
outage raises in production. So the sync shell and the sync block form
ask at every call, before the first attempt, whether an event loop runs
here and whether the call could wait at all (`may_wait`), and raise the
same error at once.

The question costs two reads in sync code (sniffio's thread-local name,
which trio sets, and asyncio's running loop, a C call) and nothing more
unless a loop runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import sniffio

from resilient._core import _internals
from resilient._core._backoff import Constant
from resilient._core._loops import refuse_blocking


if TYPE_CHECKING:
    from resilient._core._settings import RetrySettings


_thread_local: Final = sniffio.thread_local
_get_running_loop: Final = _internals.get_running_loop  # C, no raise


def may_wait(policy: RetrySettings) -> bool:
    """
    Whether a sync call through *policy* could block its thread: a
    bulkhead that queues, or retries with a backoff that waits. (Retries
    at once, `Constant(0)`, are allowed, as the wait's own check allows
    them; a server's hint or an open breaker that would make one of them
    wait is refused then, by that check.)
    """
    bulkhead = policy.bulkhead
    if (
        bulkhead is not None
        and bulkhead.max_waiting > 0
        and bulkhead.max_wait != 0
    ):
        return True
    backoff = policy.backoff
    return policy.attempts != 1 and not (
        type(backoff) is Constant and backoff.seconds == 0
    )


def refuse_in_loop(policy: RetrySettings, form: str) -> None:
    """
    Raise `RuntimeError` if an event loop runs in this thread and a sync
    call through *policy* (its *form*: ``"call"``, ``"block"``) could
    block it.
    """
    if (
        _thread_local.name is None and _get_running_loop() is None
    ) or not may_wait(policy):
        return
    instead = (
        "`async for attempt in resilient.retrying(policy)`"
        if form == "block"
        else "an async function under the policy, or `await policy.acall(fn)`"
    )
    refuse_blocking(
        f"a sync {form} through policy {policy.name!r}, which can wait "
        "between attempts,",
        instead,
    )
