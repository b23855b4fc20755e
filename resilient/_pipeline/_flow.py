"""
The one flow of a call through a policy, as a generator (the shape of
httpx's ``Auth.auth_flow``): every decision is written here once, and the
drivers (sync and async decorators, the block form; the simulator may
follow) only carry out the effects it yields.

The driver interface. The flow yields ``(op, arg)`` pairs and is sent what
each effect gave; an exception the effect raised is thrown in instead:

- ``HOOK, (hook, event)``: run the hook (await it if async; an async hook
  is cancelled at the call's deadline); send None.
- ``SLEEP, (seconds, error)``: wait (a zero wait is a checkpoint at
  most); send None. *error* is the last attempt's exception (or None),
  the cause of a refusal to block an event loop.
- ``ADMIT, guards``: ``guards.admit()`` / ``await guards.aadmit()``; send
  the tickets (a rejection is thrown in).
- ``READY, None`` (block form only): an attempt is admitted; the driver
  hands it out and sends None when the block is entered.
- ``RUN, at``: run the attempt (async: cancelled at *at*, then raise
  `DeadlineExceeded`); send ``(None, value)`` or ``(exception, None)``,
  never throw.
- ``PAUSE_RUN, at`` (a flow made with *fuse*, for the decorator drivers
  only): a zero wait, then the attempt: as ``SLEEP, (0, ...)`` then
  ``RUN, at``, in one effect (an exception of the wait is thrown in).
- ``SETTLE, (tickets, exc, own_timeout)``: ``guards.settle(...)`` or, in
  async code and unless *exc* is a cancellation, ``await
  guards.asettle(...)``; send None.
- ``NEXT, step`` (block form only): the attempt is decided and will be
  retried as *step* (a `Retry`) says; the block's ``with`` ends here, the
  loop's next iteration resumes.
- ``DISCARD, value``: the attempt's result, retried, is a response no one
  will read: close it (`resilient._pipeline._discard`); send None.
- ``FALLBACK, (fallback, exc)`` (decorators and `Policy.call` only): the
  call ended with *exc* and the policy's fallback takes over
  (`resilient._pipeline._fallback`); send what it returned (what it
  raised is thrown in and ends the call).

The flow returns the call's result or raises its error (the caller's own
exception, re-raised with a note). On every way out, the call's spans end,
its context changes are undone and any ticket taken is released.

The first attempt may run bare in a driver (no span, no machine); when it
fails, the flow starts from its exception (*failed*).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from resilient._core._decisions import GiveUp, Retry
from resilient._pipeline._call import observable
from resilient._pipeline._discard import discards
from resilient._pipeline._fallback import falls_back


if TYPE_CHECKING:
    from collections.abc import Generator

    from resilient._pipeline._call import Call

    Flow = Generator[tuple[int, Any], Any, Any]

HOOK: Final = 0
SLEEP: Final = 1
ADMIT: Final = 2
READY: Final = 3
RUN: Final = 4
SETTLE: Final = 5
NEXT: Final = 6
FALLBACK: Final = 7
PAUSE_RUN: Final = 8
DISCARD: Final = 9


def flow(  # noqa: C901, PLR0912, PLR0915 - every decision, in one place
    call: Call,
    failed: BaseException | None = None,
    *,
    block: bool = False,
    fuse: bool = False,
) -> Flow:
    """The flow of *call*; see the module's docstring."""
    guards = call.guards
    admits = guards is not None and bool(guards.stages)
    # A zero wait and the attempt after it as one effect (PAUSE_RUN), when
    # nothing comes between them (no admission, no block step).
    fuse = fuse and not admits and not block
    run = RUN
    # No hook and no block to hand a retry to: the call may decide it
    # without its record (`Call.failed`), and a retry is then its delay.
    quiet = not block and call.policy.before_sleep is None
    # No attempt timeout: every attempt's deadline is the call's, held
    # current from a failed attempt to the next (`Call.end_attempt`). Not
    # in the block form, whose caller's code runs between attempts.
    call.hold = not block and call.policy.timeout is None
    tickets: list[object] | None = None
    # The last decision: a Retry, a give-up, or a quiet retry's delay.
    step: Retry | GiveUp | float | None = None
    error: BaseException | None = None
    cause: BaseException | None = None
    value: Any = None
    # The deadline held from a failed attempt, with no span to open: the
    # next attempt needs no `Call.start_attempt`, and runs under *at*.
    held = False
    at = 0.0
    try:
        if failed is not None:
            step = call.failed(failed, quiet)
            if isinstance(step, GiveUp):
                yield from _give_up(call, step)
                raise failed  # noqa: TRY301 - the abort below sees it
            cause = failed
        while True:
            if step is not None:
                if not isinstance(step, Retry):
                    # A quiet retry: its delay, and the error it retries.
                    if fuse and step <= 0:  # type: ignore[operator] # a float: a give-up ended the call
                        run = PAUSE_RUN  # The wait goes with the attempt.
                    else:
                        yield SLEEP, (step, cause)
                else:
                    held = False  # A hook would end the hold.
                    if block:
                        yield NEXT, step
                    wait: float | GiveUp = step.delay
                    hook = call.policy.before_sleep
                    if hook is not None and observable(step.event):
                        yield from _hook(call, hook, step)
                        wait = call.after_hook(step)
                        if isinstance(wait, GiveUp):
                            yield from _give_up(call, wait)
                            result = _end(call, wait)
                            call.finish(None)
                            return result
                    yield SLEEP, (wait, step.event.exception)
                # Hold no exception of a past attempt while suspended: its
                # traceback holds the block-form loop's frame, which holds
                # this flow (a cycle that would keep a loop left with
                # `break` alive until the garbage collector runs).
                step = error = cause = value = failed = None
            if admits:
                held = False  # The admission ends the hold.
                call.enter_deadline()
                try:
                    tickets = yield ADMIT, guards
                except BaseException as rejected:
                    call.exit_deadline()
                    step = call.failed(rejected, quiet)
                    if isinstance(step, GiveUp):
                        yield from _give_up(call, step)
                        raise
                    cause = rejected
                    continue
                call.exit_deadline()
            if block:
                yield READY, None
            if not held:
                at = call.start_attempt()
            error, value = yield run, at
            run = RUN
            held = call.end_attempt(error)
            if tickets is not None:
                taken, tickets = tickets, None
                yield SETTLE, (taken, error, call.own_timeout)
            if error is None:
                step = call.returned(value)
                if not isinstance(step, Retry):
                    if step is not None:
                        yield from _give_up(call, step)
                        value = call.kept(step)
                    call.finish(None)
                    return value
                if discards(value):
                    yield DISCARD, value
            else:
                step = call.failed(error, quiet)
                if isinstance(step, GiveUp):
                    yield from _give_up(call, step)
                    raise error  # noqa: TRY301 - the abort below sees it
                cause = error
    except BaseException as exc:
        if tickets is not None:
            guards.release(tickets)  # type: ignore[union-attr]
        fallback = call.policy.fallback
        if (
            fallback is None
            or block
            or not falls_back(call.policy, exc)
            or call.callers_deadline(exc)
        ):
            call.abort(None if isinstance(exc, GeneratorExit) else exc)
            raise
        # The outermost stage: the call's own deadline is spent; the
        # fallback runs under the enclosing one.
        call.exit_deadline()
        call.fell_back(exc)
        try:
            value = yield FALLBACK, (fallback, exc)
        except BaseException as again:
            call.abort(again)
            raise
        call.fallback_answered(exc)
        call.finish(None)
        return value


def _hook(call: Call, hook: Any, step: Retry | GiveUp) -> Flow:
    """Run *hook* with the call's deadline current."""
    call.enter_deadline()
    try:
        yield HOOK, (hook, step.event)
    finally:
        call.exit_deadline()


def _give_up(call: Call, step: GiveUp) -> Flow:
    """The ``on_give_up`` hook, when there is one to tell."""
    hook = call.policy.on_give_up
    if hook is not None and observable(step.event):
        yield from _hook(call, hook, step)


def _end(call: Call, step: GiveUp) -> Any:
    """Giving up after a hook: raise the last error or keep the result."""
    event = step.event
    if event.exception is not None:
        raise event.exception
    return call.kept(step)
