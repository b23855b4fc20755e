"""
Server wait hints: parsing ``Retry-After`` values and reading them from the
exceptions common HTTP clients raise.
"""

from __future__ import annotations

import datetime as dt
import email.message
import math
from typing import Any

import pytest
import time_machine

import resilient
from resilient import default_retry_after, parse_retry_after


# 21 Oct 2015 07:00:00 UTC, as a POSIX timestamp.
NOW = dt.datetime(2015, 10, 21, 7, 0, 0, tzinfo=dt.UTC)
HTTP_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"  # NOW + 28 minutes.


def short(value: object) -> str:
    """A test id that stays readable for huge values."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} chars)"


@pytest.fixture
def frozen_wall() -> Any:
    """The wall clock stands still at NOW (the monotonic clock is left)."""
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


# --- parse_retry_after


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0.0),
        (120, 120.0),
        (1.5, 1.5),
        (0.0, 0.0),
        ("120", 120.0),
        (" 120\t", 120.0),
        ("0", 0.0),
        ("007", 7.0),
        (b"120", 120.0),
        (b" 3 ", 3.0),
        (dt.timedelta(minutes=2), 120.0),
        (dt.timedelta(0), 0.0),
        (dt.timedelta(milliseconds=250), 0.25),
        ("9" * 300, float("9" * 300)),
    ],
)
def test_seconds(value: object, expected: float) -> None:
    """
    Seconds as a number, a `timedelta`, or a ``Retry-After`` delay-seconds
    header (str or bytes, surrounding whitespace ignored) are returned as
    float seconds.
    """
    result = parse_retry_after(value)
    assert result == expected
    assert type(result) is float


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        -1,
        -0.5,
        math.nan,
        math.inf,
        -math.inf,
        "",
        "   ",
        "-5",
        "+5",
        "1.5",  # RFC 9110 delay-seconds is an integer.
        "1e3",
        "soon",
        "²",  # str.isdigit() says yes; it is not an ASCII digit.
        "١٢٠",  # Arabic-Indic digits: not delay-seconds either.
        b"\xff\xfe",
        dt.timedelta(seconds=-1),
        "Wed, 32 Oct 2015 07:28:00 GMT",  # No such day.
        "Wed, 21 Oct 99999 07:28:00 GMT",  # Year out of range.
        "Wed, 21 Oct 2015 07:28:00 +99999999999999999999",  # Overflow.
        "Wed, 21 Oct 2015",
        object(),
        [120],
        {"Retry-After": "1"},
        dt.date(2030, 1, 1),
    ],
    ids=short,
)
def test_unusable_hints_give_none(value: object) -> None:
    """
    Garbage, negative, NaN, infinite and out-of-range hints give None (no
    hint), never an exception: a broken header must not break the retry.
    """
    assert parse_retry_after(value) is None


@pytest.mark.parametrize(
    "value",
    [
        10**400,  # Beyond any float.
        "1" + "0" * 400,  # Likewise, as a header.
        "1" + "0" * 5000,  # Longer than int() accepts by default.
    ],
    ids=short,
)
def test_hints_beyond_any_float_are_infinite(value: object) -> None:
    """
    A hint too large for a float is a very long wait (infinite), not
    garbage: retry clamps it to its max_retry_after.
    """
    assert parse_retry_after(value) == math.inf


@pytest.mark.parametrize("header", ["9" * 500, 10**400])
def test_huge_retry_after_is_clamped_by_retry(
    driver: Any, clock: Any, header: object
) -> None:
    """
    A Retry-After too large for a float makes the retry wait the policy's
    max_retry_after (it used to be ignored, and the backoff used instead).
    """

    class Throttled(Exception):
        def __init__(self) -> None:
            super().__init__("slow down")
            self.headers = {"Retry-After": header}

    calls: list[int] = []

    def body() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise Throttled
        return "ok"

    policy = resilient.Policy(
        name="huge-hint",
        retry_on=Throttled,
        max_retry_after=7,
        budget=None,
        backoff=resilient.Constant(seconds=1),
    )
    assert driver.call(policy, body) == "ok"
    assert clock.sleeps == [7.0]


def test_http_date_in_the_future(frozen_wall: Any) -> None:
    """An HTTP-date is the seconds from the wall clock's now to that date."""
    assert parse_retry_after(HTTP_DATE) == 28 * 60.0
    assert parse_retry_after(HTTP_DATE.encode()) == 28 * 60.0


def test_http_date_obsolete_formats(frozen_wall: Any) -> None:
    """The obsolete RFC 850 and asctime forms of an HTTP-date parse too."""
    assert parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT") == 1680.0
    assert parse_retry_after("Wed Oct 21 07:28:00 2015") == 1680.0


def test_http_date_in_the_past_gives_zero(frozen_wall: Any) -> None:
    """A date already passed means retry now: 0.0, not a negative wait."""
    assert parse_retry_after("Wed, 21 Oct 2015 06:00:00 GMT") == 0.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT") == 0.0


def test_http_date_follows_the_wall_clock(frozen_wall: Any) -> None:
    """A date is measured against the wall clock (it is a wall time)."""
    frozen_wall.shift(dt.timedelta(minutes=20))
    assert parse_retry_after(HTTP_DATE) == 8 * 60.0


def test_http_date_with_an_offset(frozen_wall: Any) -> None:
    """A date with a numeric zone is converted to UTC first."""
    assert parse_retry_after("Wed, 21 Oct 2015 09:28:00 +0200") == 1680.0
    # "-0000" gives a naive datetime, read as UTC.
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 -0000") == 1680.0


def test_explicit_now() -> None:
    """*now* replaces the wall clock as the reference for dates."""
    now = NOW.timestamp()
    assert parse_retry_after(HTTP_DATE, now=now) == 1680.0
    assert parse_retry_after(HTTP_DATE, now=now + 1680.0) == 0.0
    assert parse_retry_after(HTTP_DATE, now=now + 9999.0) == 0.0
    # *now* plays no part for delay-seconds.
    assert parse_retry_after("5", now=0.0) == 5.0


def test_aware_datetime(frozen_wall: Any) -> None:
    """An aware `datetime` is compared in absolute time."""
    cest = dt.timezone(dt.timedelta(hours=2))
    when = dt.datetime(2015, 10, 21, 9, 0, 30, tzinfo=cest)
    assert parse_retry_after(when) == 30.0
    assert parse_retry_after(NOW - dt.timedelta(seconds=1)) == 0.0


def test_naive_datetime_is_utc(frozen_wall: Any) -> None:
    """A naive `datetime` is read as UTC, the zone of every HTTP-date."""
    when = dt.datetime(2015, 10, 21, 7, 1, 0)  # noqa: DTZ001
    assert parse_retry_after(when) == 60.0


# --- default_retry_after


class Hinted(Exception):
    """An exception carrying whatever attributes a test gives it."""

    def __init__(self, **attributes: object) -> None:
        super().__init__("hinted")
        for name, value in attributes.items():
            setattr(self, name, value)


class Response:
    """Stands in for an httpx or requests response."""

    def __init__(self, headers: object) -> None:
        self.headers = headers


class Headers:
    """A header container that is not a Mapping but has ``get``."""

    def __init__(self, **values: str) -> None:
        self._values = {k.lower(): v for k, v in values.items()}

    def get(self, name: str, default: object = None) -> object:
        return self._values.get(name.lower(), default)


def test_reads_retry_after_attribute() -> None:
    """An exception's own ``retry_after`` (seconds or header) is read."""
    assert default_retry_after(Hinted(retry_after=5)) == 5.0
    assert default_retry_after(Hinted(retry_after="7")) == 7.0
    assert default_retry_after(
        Hinted(retry_after=dt.timedelta(seconds=2))
    ) == (2.0)


@pytest.mark.parametrize(
    "headers",
    [
        {"Retry-After": "3"},
        {"retry-after": "3"},
        {"RETRY-AFTER": "3"},
        {b"retry-after": b"3"},
        {"Content-Type": "text/plain", 1: "x", "Retry-after": "3"},
        Headers(Retry_After="ignored", **{"retry-after": "3"}),
    ],
    ids=short,
)
def test_reads_exception_headers(headers: object) -> None:
    """
    ``exc.headers`` is searched for Retry-After whatever its case: a dict, a
    case-insensitive mapping, or any object with ``get``.
    """
    assert default_retry_after(Hinted(headers=headers)) == 3.0


def test_reads_http_message_headers() -> None:
    """The standard library's header objects (urllib's HTTPError) work."""
    message = email.message.Message()
    message["retry-after"] = "4"
    assert default_retry_after(Hinted(headers=message)) == 4.0


def test_reads_response_headers() -> None:
    """``exc.response.headers`` (httpx, requests) is read last."""
    exc = Hinted(response=Response({"Retry-After": "9"}))
    assert default_retry_after(exc) == 9.0
    exc = Hinted(response=Response(Headers(**{"Retry-After": "9"})))
    assert default_retry_after(exc) == 9.0


def test_order_of_places(frozen_wall: Any) -> None:
    """
    ``retry_after`` wins over ``headers``, which win over the response's;
    a place without a hint lets the next one speak.
    """
    response = Response({"Retry-After": "30"})
    assert (
        default_retry_after(
            Hinted(
                retry_after=1, headers={"Retry-After": "2"}, response=response
            )
        )
        == 1.0
    )
    assert (
        default_retry_after(
            Hinted(headers={"Retry-After": "2"}, response=response)
        )
        == 2.0
    )
    assert default_retry_after(Hinted(headers={}, response=response)) == 30.0
    assert (
        default_retry_after(
            Hinted(retry_after=None, headers={"X": "1"}, response=response)
        )
        == 30.0
    )
    dated = Hinted(response=Response({"Retry-After": HTTP_DATE}))
    assert default_retry_after(dated) == 1680.0


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("plain"),
        Hinted(retry_after=None),
        Hinted(retry_after="soon"),
        Hinted(retry_after=-1),
        Hinted(headers=None),
        Hinted(headers={}),
        Hinted(headers={"Retry-After": "later"}),
        Hinted(headers="Retry-After: 5"),  # A str has no usable get.
        Hinted(headers=object()),
        Hinted(headers=type("NotCallable", (), {"get": 3})()),
        Hinted(response=None),
        Hinted(response=Response(None)),
        Hinted(response=Response({"Content-Length": "0"})),
    ],
    ids=lambda e: f"{type(e).__name__}({vars(e)!r})",
)
def test_no_hint_gives_none(exc: Exception) -> None:
    """Without a usable hint anywhere, the answer is None."""
    assert default_retry_after(exc) is None


def test_is_the_policy_default() -> None:
    """Policies read hints with `default_retry_after` unless told not to."""
    assert resilient.Policy().retry_after is default_retry_after


def test_hint_set_on_a_builtin_exception_instance() -> None:
    """A hint attached to a plain built-in exception is still read."""
    exc = ConnectionError("throttled")
    exc.retry_after = 4  # type: ignore[attr-defined]
    assert default_retry_after(exc) == 4.0
    assert default_retry_after(ConnectionError("plain")) is None
