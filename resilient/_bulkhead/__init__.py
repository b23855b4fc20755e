"""
Bulkhead: bounded concurrency per dependency, with a bounded wait queue and
a maximum wait.

`BulkheadMachine` holds the slots and the FIFO queue of waiting permits
behind a short lock (a `threading.RLock`, below) and decides: admit,
queue, reject. It never blocks. The shells of `Bulkhead` only wait
(`resilient._wait`): a thread on a `ThreadWaiter`, a task on a
`TaskWaiter` that a releaser in another thread wakes through the task's
event loop. Threads and tasks share the same slots.

A freed slot goes straight to the first waiter (it never becomes free in
between, so a newcomer cannot overtake the queue).

**Asynchronous exceptions.** A permit is one object from before its slot is
taken until after it is given back, and every step on it is recoverable:

- The permit exists before the slot: the machine marks it held in the same
  locked step that takes the slot (or grants it to the queued permit), so
  there is never a slot without a permit that knows it holds it. The
  pipeline's bare first attempt has the machine make the permit too
  (`BulkheadMachine.take_new`, before it takes the lock), one call in all;
  after a breaker, `_pair.BreakerBulkhead` does the same steps (and the
  release's) inline, written the same way.
- `BulkheadPermit.release` is idempotent and handles every state: held
  (the slot passes on), queued (it leaves the queue), granted but not yet
  woken (the slot passes on), never taken (nothing to do). The waits call
  it from ``except BaseException``, so a waiter cancelled or interrupted at
  any point hands its turn on.
- A permit dropped while it holds its slot (an exception between the grant
  and the caller's ``try``, or at the first line of the exit method) gives
  the slot back once it is freed: the machine knows its held permits by
  weak reference, and the next queueing, waiter's re-check or
  `BulkheadMachine.statistics` finds the dead one. No finalizer runs Python
  code, so none can swallow an asynchronous exception. A permit is freed
  at once by reference counting, or at the next pass of the cyclic
  collector when the exception's traceback sits in a reference cycle; until
  then its slot counts as held.
- ``with bulkhead:`` keeps its permit in per-``with`` state
  (`resilient._core._entered.PerWith`), not in a context variable, so a
  block cut short anywhere drops its permit with it.
- Inside the lock, each state change is written so that CPython's
  eval-breaker checks (where asynchronous exceptions land: after a call
  returns, at a function's first line, on a backward jump) see a
  consistent state: the permit's state and the counters are stored with no
  call in between, and the queue is popped or appended after them. The
  held permits' set is the count of slots in use, so a grant's add and a
  release's discard each take or give back the slot in one call, and a
  second discard frees nothing. A grant whose wake-up an exception cut off
  is found by the waiter's own re-check (`RECHECK`).
- The lock is a `threading.RLock`: the pipeline's pair takes it without
  ``with`` and releases only what this thread holds (see `_pair`).

Every step is tested by an interrupt storm (``tests/test_bulkhead_storm.py``).

The package: the machine and its permits (`_machine`), the two shells of
`Bulkhead` side by side (`_shells`), the registry (`_registry`), the
instruments (`_metrics`) and the pipeline's breaker-then-bulkhead pair
(`_pair`, imported by the pipeline only).
"""

from __future__ import annotations

from resilient._bulkhead._machine import (
    RECHECK,
    BulkheadMachine,
    BulkheadPermit,
    BulkheadStatistics,
    Permit,
    RejectReason,
)
from resilient._bulkhead._registry import BULKHEADS, bulkhead, get_bulkhead
from resilient._bulkhead._shells import Bulkhead


__all__ = [
    "BULKHEADS",
    "RECHECK",
    "Bulkhead",
    "BulkheadMachine",
    "BulkheadPermit",
    "BulkheadStatistics",
    "Permit",
    "RejectReason",
    "bulkhead",
    "get_bulkhead",
]
