"""
The Redis and PostgreSQL backends' pure parts, without a server: URL
options, reply parsing, error mapping, and `LockBackendError` itself.
"""

from __future__ import annotations

import pickle

import pytest
import redis.exceptions

from resilient._backends import (
    Busy,
    Grant,
    LockKey,
    OwnerToken,
    _postgres,
    _redis,
)
from resilient.exceptions import ConfigError, LockBackendError


def test_postgres_timeout_must_be_seconds() -> None:
    """A timeout that is not a number of seconds is a ConfigError."""
    with pytest.raises(ConfigError, match="timeout"):
        _postgres.sync_backend("postgresql://h/db?timeout=soon")


def test_postgres_replies() -> None:
    """
    A grant row gives the fence; a busy row the holder's time left (never
    negative); no row at all (the holder's row not visible yet) is Busy
    with no hint.
    """
    read = _postgres.Statements.read_acquire
    assert read([(42, None)], 1.0) == Grant(fence=42, ttl=1.0)
    assert read([(None, -0.5)], 1.0) == Busy(expires_in=0.0)
    assert read([], 1.0) == Busy(expires_in=None)
    assert _postgres.Statements.read_renew([(2,)], 3) == [False, True, False]


def test_redis_replies() -> None:
    """
    Redis answers ``{1, fence}`` for a grant and ``{0, pttl}`` when busy;
    a key with no expiry (PTTL -1) gives no hint.
    """
    read = _redis.Commands.read_acquire
    assert read([1, b"17"], 0.0001) == Grant(fence=17, ttl=0.001)
    assert read([0, 1500], 1.0) == Busy(expires_in=1.5)
    assert read([0, -1], 1.0) == Busy(expires_in=None)


def test_redis_error_codes() -> None:
    """
    Error replies map to their code; a reply without an upper-case code is
    ``ERR``; other exceptions name their type; an owner token in a message
    is blotted out; only transient codes are retryable.
    """
    owner = OwnerToken()
    command = _redis.Commands("ns", 1.0).acquire(LockKey.of("x"), owner, 1.0)
    cases = [
        (
            redis.exceptions.ResponseError("WRONGTYPE wrong kind"),
            "WRONGTYPE",
            False,
        ),
        (redis.exceptions.ResponseError("oops lower case"), "ERR", False),
        (redis.exceptions.ResponseError(f"OOM {owner.hex}"), "OOM", True),
        (redis.exceptions.BusyLoadingError("loading"), "LOADING", True),
        (redis.exceptions.AuthenticationError("no"), "NOAUTH", False),
        (redis.exceptions.TimeoutError("slow"), "timeout", True),
        (ConnectionResetError("reset"), "connection", True),
        (redis.exceptions.DataError("bad"), "DataError", False),
    ]
    for exc, code, retryable in cases:
        error = _redis.backend_error(exc, command)
        assert (error.reason, error.retryable) == (code, retryable)
        assert owner.hex not in str(error)


def test_lock_backend_error_pickles() -> None:
    """A LockBackendError survives pickling with its fields and message."""
    error = LockBackendError("redis", "OOM", "full", retryable=True)
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert type(again) is LockBackendError
    assert (again.scheme, again.reason, again.retryable) == (
        "redis",
        "OOM",
        True,
    )
    assert str(again) == str(error) == "redis lock store: OOM: full"
