"""Deadlines and timeout scopes that ran out, and the unwinding of a
stopped scope."""

from __future__ import annotations

from resilient._errors._base import ResilientError, _Portable


class DeadlineExceeded(ResilientError, TimeoutError):
    """
    A deadline or timeout passed before the work finished.

    A subclass of the built-in `TimeoutError`, so code that already catches
    timeouts catches it, and the default retry policy treats it as transient.

    When it ended an attempt of a policy (at the policy's attempt
    *timeout*, its *budget*, or a deadline around the call), the policy
    says so in its message and attributes:
    ``attempt timeout of 0.500 s exceeded (policy 'payments', attempt 2)``,
    ``budget of 30.000 s exceeded (policy 'payments', attempt 4)``,
    ``enclosing deadline exceeded 5.000 s into the call (policy
    'payments', attempt 3)``.

    Attributes:
        deadline: The absolute deadline on resilient's clock, in seconds.
        policy: The name of the policy whose attempt it ended, or None.
        attempt: The number of that attempt (1 for the first), or None.
        limit: Which limit it was: ``"timeout"`` (the policy's attempt
            timeout), ``"budget"`` (the policy's budget), ``"deadline"``
            (a deadline around the call), ``"item"`` (the policy's timeout
            on a stream's item after its first); None when no policy's
            attempt ended at it.
        seconds: How long *limit* allowed, in seconds: the timeout, the
            budget, or for ``"deadline"`` the time from the call's start;
            None when not known.
        request: The HTTP request (httpx's) in flight when the deadline
            cancelled an async attempt, or None: `Transient` judges the
            error by it, as it judges the client's own timeout error.

    .. versionchanged:: 26.12.0
       *policy*, *attempt*, *limit* and *seconds*, and the message that
       shows them; *request*.
    """

    # Class defaults: a deadline that ended no policy's attempt costs no
    # more to raise than before.
    policy: str | None = None
    attempt: int | None = None
    limit: str | None = None
    seconds: float | None = None
    request: object | None = None

    def __init__(self, deadline: float, what: str = "deadline") -> None:
        self.deadline = deadline
        super().__init__(f"{what} exceeded")

    def _ended_attempt(
        self, policy: str, attempt: int, limit: str, seconds: float
    ) -> None:
        """Say which policy's *limit* (of *seconds*) ended its *attempt*:
        called once the attempt failed, so a success never pays for it."""
        self.policy = policy
        self.attempt = attempt
        self.limit = limit
        self.seconds = seconds
        where = f"policy {policy!r}, attempt {attempt}"
        if limit == "timeout":
            text = f"attempt timeout of {seconds:.3f} s exceeded ({where})"
        elif limit == "budget":
            text = f"budget of {seconds:.3f} s exceeded ({where})"
        elif limit == "item":
            text = (
                f"stream item timeout of {seconds:.3f} s exceeded ({where}, "
                "after its first item)"
            )
        else:
            text = (
                f"enclosing deadline exceeded {seconds:.3f} s into the "
                f"call ({where})"
            )
        self.args = (text,)


class TimedOut(DeadlineExceeded):
    """
    A timeout scope (`resilient.timeout` and friends) ran out of time.

    Raised by the scope whose own deadline passed, never by a scope inside
    it that an enclosing deadline cut short.
    Its message says how long the scope allowed and, for a named scope,
    which one: ``timeout of 2.000 s exceeded (scope 'fetch')``.

    Attributes:
        deadline: The scope's absolute deadline on resilient's clock.
        scope: The `resilient.TimeoutScope` that fired (None once
            unpickled in another process).
        seconds: The time the scope allowed from its entry, in seconds, or
            None if not known.
        name: The scope's name, or None.

    .. versionchanged:: 26.12.0
       *seconds* and *name*, and the message that shows them.
    """

    _process_local = ("scope",)

    def __init__(
        self,
        deadline: float,
        scope: object = None,
        seconds: float | None = None,
        name: str | None = None,
    ) -> None:
        self.scope = scope
        self.seconds = seconds
        self.name = name
        what = "timeout" if seconds is None else f"timeout of {seconds:.3f} s"
        super().__init__(deadline, what)
        if name is not None:
            self.args = (f"{self.args[0]} (scope {name!r})",)


class ScopeCancelled(_Portable):
    """
    Unwinds sync code out of a timeout scope that was cancelled or whose
    deadline passed; the scope it names catches it.

    A `BaseException`, like trio's ``Cancelled``, so that ``except
    Exception`` in the code being stopped does not swallow it and retry
    never retries it. Seen only by code that catches `BaseException` or
    runs a scope's work in another thread.

    Attributes:
        scope: The `resilient.TimeoutScope` that fired (None once unpickled
            in another process).
    """

    _process_local = ("scope",)

    def __init__(self, scope: object) -> None:
        self.scope = scope
        super().__init__(f"cancelled by {scope!r}")
