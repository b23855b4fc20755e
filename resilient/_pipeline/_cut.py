"""
An async attempt cut short at its deadline: the error it ends in, and
whether the attempt may run again.

The cancellation that cut it passed through the attempt's frames on its way
out; when those include an HTTP client's, the request in flight goes on the
error (`resilient._core._transient.in_flight_request`), and the policy's own
timeout, retried whatever *retry_on* says, is not retried when that request
must not run twice (a POST without an idempotency key): the rule the
client's own timeout error is judged by.
"""

from __future__ import annotations

from typing import Final

from resilient._core._transient import Transient, in_flight_request
from resilient.exceptions import DeadlineExceeded


def timed_out(at: float, cut: BaseException | None = None) -> DeadlineExceeded:
    """
    The error of an attempt cancelled at its deadline *at*, *cut* being
    the cancellation as it left the attempt: the HTTP request it cut short
    (`in_flight_request`) goes on the error as its ``request``, so that
    `Transient` and the policy's own timeout judge the error as they judge
    the client's own timeout error (a POST without a key is not repeated).
    """
    error = DeadlineExceeded(at, "attempt deadline")
    if cut is not None:
        request = in_flight_request(cut)
        if request is not None:
            error.request = request
    return error


_DEFAULT_RULE: Final = Transient()


def may_repeat(retry_on: object, exc: DeadlineExceeded) -> bool:
    """
    Whether the attempt the policy's own timeout cut (*exc*) may run again:
    True unless it cut an HTTP request that must not be repeated, by
    *retry_on*'s rule if it has one (`Transient.may_repeat`: method,
    idempotency header), else by the default `Transient`'s.
    """
    if exc.request is None:
        return True
    rule = getattr(retry_on, "may_repeat", None)
    if not callable(rule):
        rule = _DEFAULT_RULE.may_repeat
    return bool(rule(exc))
