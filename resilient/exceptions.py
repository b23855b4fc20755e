"""
The exceptions resilient raises.

resilient never wraps the exception of a call it gave up on: it re-raises that
exception itself, with a note.
The exceptions here are for what resilient itself decides: bad configuration,
a deadline that passed, a breaker that is open or a bulkhead that is full.

Every exception here pickles, copies and deep-copies with its message and its
attributes, so it crosses a `concurrent.futures.ProcessPoolExecutor` or a
`multiprocessing` pool intact: `ResilientError` (and `ScopeCancelled`)
rebuild an exception from its ``args`` and its ``__dict__`` without calling
``__init__`` again, so a subclass gets this for free whatever its signature.
An attribute that holds something local to the process (a live
`resilient.TimeoutScope`) is listed in ``_process_local``: it becomes None in
a pickle and is shared, not copied, by `copy.deepcopy`.
A new exception must pickle: ``tests/test_exceptions.py`` checks every class
in ``__all__``.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, ClassVar, Self, TypeVar, final


__all__ = [
    "BulkheadFull",
    "CircuitOpen",
    "ConfigError",
    "ConfigTypeError",
    "DeadlineExceeded",
    "GaveUpOnResult",
    "LockBackendError",
    "LockLost",
    "LockNotAcquired",
    "Rejected",
    "ResilientError",
    "ScopeCancelled",
    "TimedOut",
]


class _Portable(BaseException):
    """
    Pickling and copying by ``args`` and ``__dict__`` (see the module's
    docstring): ``BaseException``'s own way calls ``__init__`` with
    ``args``, which breaks as soon as ``__init__`` takes other arguments.
    """

    # Attributes that mean nothing in another process: None in a pickle,
    # shared (not copied) by deepcopy.
    _process_local: ClassVar[tuple[str, ...]] = ()

    def _state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._process_local:
            if name in state:
                state[name] = None
        return state

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self._state()))

    def __copy__(self) -> Self:
        return _rebuild(type(self), self.args, self.__dict__)

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        local = {
            name: self.__dict__[name]
            for name in self._process_local
            if name in self.__dict__
        }
        rest = {k: v for k, v in self.__dict__.items() if k not in local}
        new = _rebuild(type(self), copy.deepcopy(self.args, memo), local)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(rest, memo))
        return new


_E = TypeVar("_E", bound=BaseException)


def _rebuild(
    cls: type[_E], args: tuple[Any, ...], state: dict[str, Any]
) -> _E:
    """An exception from its args and attributes, without ``__init__``."""
    exc = cls.__new__(cls, *args)
    # Set again: OSError subclasses (TimeoutError) leave it to __init__.
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ResilientError(_Portable, Exception):
    """
    Base class of every exception resilient raises on its own account.

    Every subclass pickles with its message and attributes.
    """


class ConfigError(ResilientError, ValueError):
    """
    A setting has a value that makes no sense; raised at construction.

    Attributes:
        field: The qualified name of the setting, like ``"Policy.attempts"``.
        value: The value that was refused; unpickled in another process,
            its repr when the value itself does not pickle (a lambda).
    """

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} {why}, got {value!r}")

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        try:
            pickle.dumps(self.value)
        except Exception:  # noqa: BLE001 - any failure to pickle
            state["value"] = repr(self.value)
        return state


@final
class ConfigTypeError(ConfigError, TypeError):
    """
    A setting has the wrong type (``True`` for an int included).
    """


@final
class GaveUpOnResult(ResilientError):
    """
    Retrying on a result stopped and the policy's *last_result* is
    ``"raise"``: the last result the policy's *retry_if_result* rejected
    (a 503 response), carried as an exception instead of returned.

    Not retried by an enclosing policy (it carries no HTTP status of its
    own); a policy's *fallback* takes over from it like from any other
    final exception.

    Attributes:
        result: The last result; unpickled in another process, its repr
            when the result itself does not pickle.
        attempts: How many attempts were made.
        reason: Why retrying stopped (a ``GiveUpReason``:
            ``"attempts"``, ``"budget"``, ``"not_retryable"`` for a
            response to a request that may not be repeated, ...).
        policy: The policy's name.

    .. versionadded:: 26.12.0
    """

    def __init__(
        self, result: object, attempts: int, reason: str, policy: str
    ) -> None:
        self.result = result
        self.attempts = attempts
        self.reason = reason
        self.policy = policy
        super().__init__(
            f"gave up on {policy!r} after {attempts} "
            f"attempt{'s' if attempts != 1 else ''} "
            f"({reason.replace('_', ' ')}); last result: {_short(result)}"
        )

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        try:
            pickle.dumps(self.result)
        except Exception:  # noqa: BLE001 - any failure to pickle
            state["result"] = repr(self.result)
        return state


def _short(value: object, limit: int = 200) -> str:
    """A repr for a message, cut to *limit* characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the error
        text = f"<{type(value).__qualname__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
            (a deadline around the call); None when no policy's attempt
            ended at it.
        seconds: How long *limit* allowed, in seconds: the timeout, the
            budget, or for ``"deadline"`` the time from the call's start;
            None when not known.

    .. versionchanged:: 26.12.0
       *policy*, *attempt*, *limit* and *seconds*, and the message that
       shows them.
    """

    # Class defaults: a deadline that ended no policy's attempt costs no
    # more to raise than before.
    policy: str | None = None
    attempt: int | None = None
    limit: str | None = None
    seconds: float | None = None

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
        else:
            text = (
                f"enclosing deadline exceeded {seconds:.3f} s into the "
                f"call ({where})"
            )
        self.args = (text,)


class Rejected(ResilientError):
    """
    A stage refused a call without running it (an open breaker, a full
    bulkhead): nothing reached the dependency.

    Retry outwaits a rejection that says when to come back: it waits
    *retry_after* (spread by its jitter) and tries again, and gives up at
    once when that is past the deadline. A rejection is not an attempt, but
    a call tolerates at most as many of them as it has attempts.

    Attributes:
        retry_after: Seconds until the stage may admit the call (`math.inf`
            when only a reset will); None when the stage cannot tell, and
            retry then treats the rejection as any other error (its
            *retry_on* decides).

    .. versionadded:: 26.12.0
    """

    retry_after: float | None = None


@final
class BulkheadFull(Rejected):
    """
    A bulkhead refused a call: every slot was taken and the caller could
    not wait for one.

    Not a failure of the dependency: a circuit breaker does not count it.
    Its *retry_after* is None: the bulkhead already waited as long as it
    was configured to, so retry does not wait again unless its *retry_on*
    says so.

    Attributes:
        name: The bulkhead's name.
        reason: ``"full"`` (no waiting allowed), ``"queue_full"`` (too many
            callers already waiting), ``"timeout"`` (waited the maximum wait)
            or ``"deadline"`` (the enclosing deadline ended the wait).
        max_concurrent: The bulkhead's number of slots.
        waited: Seconds the caller waited before being refused.
    """

    def __init__(
        self, name: str, reason: str, max_concurrent: int, waited: float
    ) -> None:
        self.name = name
        self.reason = reason
        self.max_concurrent = max_concurrent
        self.waited = waited
        super().__init__(
            f"bulkhead {name!r} is full ({max_concurrent} calls in flight; "
            f"{reason}, waited {waited:.3f} s)"
        )


class CircuitOpen(Rejected):
    """
    A circuit breaker rejected a call without running it.

    Attributes:
        name: The breaker's name (the dependency).
        retry_after: Seconds until the breaker admits a probe; `math.inf`
            when it was forced open (until someone resets it).
        state: The breaker's state: ``"open"``, ``"half_open"`` (all probe
            slots taken) or ``"forced_open"``.
        opened_by: The exception of the call that opened the breaker, as a
            copy without its traceback (so that an open breaker keeps no
            frames alive); None when no exception opened it (slow calls, a
            stuck probe, `CircuitBreaker.force_open`), and in a pickle when
            it does not survive pickling. Copies of the rejection share
            it.

    .. versionchanged:: 26.12.0
       *opened_by*.
    """

    # The attributes live in ``args``: a breaker makes its rejections with
    # ``CircuitOpen.__new__`` alone (``BaseException.__new__`` sets
    # ``args``), so that a rejection, a hot path mostly caught unseen,
    # costs what any exception costs. The message is built in __str__.
    def __init__(
        self,
        name: str,
        retry_after: float,
        state: str = "open",
        opened_by: BaseException | None = None,
    ) -> None:
        self.args = (name, retry_after, state, opened_by)

    @property
    def name(self) -> str:
        """The breaker's name."""
        return self.args[0]  # type: ignore[no-any-return]

    @property
    def retry_after(self) -> float:  # type: ignore[override]
        """Seconds until the breaker admits a probe."""
        return self.args[1]  # type: ignore[no-any-return]

    @property
    def state(self) -> str:
        """The breaker's state when it rejected the call."""
        args = self.args
        return args[2] if len(args) > 2 else "open"

    @property
    def opened_by(self) -> BaseException | None:
        """The exception that opened the breaker, without its traceback."""
        args = self.args
        return args[3] if len(args) > 3 else None

    def __reduce__(self) -> tuple[Any, ...]:
        args = self.args
        if len(args) > 3 and args[3] is not None:
            try:
                pickle.loads(pickle.dumps(args[3]))  # noqa: S301
            except Exception:  # noqa: BLE001 - any failure to round-trip
                args = (*args[:3], None)
        return (_rebuild, (type(self), args, self._state()))

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        # The failure is a record, shared by copies: many exceptions do not
        # copy (keyword-only arguments), and nothing should change it.
        new = _rebuild(type(self), self.args, {})
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __str__(self) -> str:
        when = (
            "until it is reset"
            if self.retry_after == float("inf")
            else f"next probe in {self.retry_after:.3f} s"
        )
        state = self.state.replace("_", "-")
        return f"circuit breaker {self.name!r} is {state}; {when}"


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


class LockBackendError(ResilientError):
    """
    A lock's store (Redis, PostgreSQL) answered a request with an error, or
    could not be reached in time: the outcome of the request is unknown.

    A lock never reads it as acquired, renewed or released: a failed
    acquire is tried again within the wait's deadline when `retryable`, a
    failed renewal is retried until the lease's validity runs out when
    `retryable` (and otherwise loses the lease at once: `LockLost` with
    reason ``"refused"``, this error as its cause), and a failed release
    leaves the lease to expire on the store.

    The message names the scheme, the store's host and port and its error
    code, never the whole URL (it may hold a password) nor an owner token.

    Attributes:
        scheme: The URL scheme of the store, like ``"redis"``.
        where: The store's host and port from its URL, like
            ``"10.0.0.5:6379"`` (no user name or password), or `None`.
        reason: A short code: the store's error code (``"OOM"``,
            ``"READONLY"``, ``"LOADING"``, ``"BUSY"``, ``"WRONGTYPE"``,
            ``"NOAUTH"``, ``"NOPERM"``; a PostgreSQL SQLSTATE such as
            ``"42501"``), or ``"connection"`` (the connection failed or was
            lost) or ``"timeout"`` (no reply within the call's time limit).
        retryable: False when trying again cannot help (a key of another
            type, a refused login or permission: a configuration error).

    .. versionadded:: 26.11.0
    """

    def __init__(
        self,
        scheme: str,
        reason: str,
        message: str,
        *,
        retryable: bool,
        where: str | None = None,
    ) -> None:
        self.scheme = scheme
        self.reason = reason
        self.retryable = retryable
        self.where = where
        at = f" at {where}" if where else ""
        super().__init__(f"{scheme} lock store{at}: {reason}: {message}")


class LockNotAcquired(Rejected):
    """
    A lock was not acquired: it was held and the caller could not wait (or
    waited as long as allowed), or the store did not answer.

    Not a failure of the dependency. Never carries the owner token. A
    `Rejected`: retry outwaits it when the store said when the holder's
    lease runs out (*retry_after*), within the deadline.

    Attributes:
        name: The lock's name.
        reason: ``"busy"`` (held, no wait allowed), ``"timeout"`` (the
            lock's own wait ran out), ``"deadline"`` (the enclosing deadline
            ended the wait) or ``"unavailable"`` (the store did not answer;
            the store's error is the ``__cause__``).
        waited: Seconds spent trying.
        retry_after: Seconds until the holder's lease expires if it is not
            renewed, when the store said; None when it did not (the store
            did not answer, or cannot tell): a hint, not a promise.

    """

    def __init__(
        self,
        name: str,
        reason: str,
        waited: float,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(name, reason, waited, retry_after)
        self.name = name
        self.reason = reason
        self.waited = waited
        self.retry_after = retry_after

    def __str__(self) -> str:
        why = {
            "busy": "it is held",
            "timeout": "it is held and the wait timed out",
            "deadline": "it is held and the deadline ran out",
            "unavailable": "the lock store did not answer",
        }.get(self.reason, self.reason)
        return (
            f"lock {self.name!r} not acquired: {why} "
            f"(waited {self.waited:.3f} s)"
        )


@final
class LockLost(ResilientError):
    """
    A held lock's lease was lost: the store no longer had it (it expired,
    or was deleted or taken), or it could not be renewed before it ran out
    on the holder's clock. The work the lock protected must stop; what it
    wrote with the lease's fencing token may be refused by the resource.

    Raised by `Lease.checkpoint`, and by leaving the lock's block (unless
    the block is already raising). Never carries the owner token.

    Attributes:
        name: The lock's name.
        fence: The fencing token of the lost lease.
        reason: ``"gone"`` (the store said it is not ours), ``"expired"``
            (not renewed in time on our clock), ``"refused"`` (the store
            refused a renewal for good, such as a revoked password or
            permission: the `LockBackendError` is the ``__cause__``) or
            ``"forked"`` (this process is a fork of the holder).
    """

    def __init__(self, name: str, fence: int, reason: str) -> None:
        super().__init__(name, fence, reason)
        self.name = name
        self.fence = fence
        self.reason = reason

    def __str__(self) -> str:
        why = {
            "gone": "the store no longer holds it",
            "expired": "it was not renewed before its lease ran out",
            "refused": "the store refused its renewal for good",
            "forked": "this process is a fork of the holder",
        }.get(self.reason, self.reason)
        return f"lock {self.name!r} lost (fence {self.fence}): {why}"
