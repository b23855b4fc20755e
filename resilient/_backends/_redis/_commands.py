"""
The sans-IO layer of the Redis backend: the Lua scripts, the commands that
run them, the URL's options, and how replies and errors are read.
"""

from __future__ import annotations

import hashlib
import math
import re
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, final

import attrs
from redis import exceptions as rx

from resilient._backends._base import (
    Busy,
    Grant,
    ReleaseResult,
    call_limit,
    hide,
    ttl_ms,
    url_repr,
    url_seconds,
    url_secrets,
    url_where,
)
from resilient.exceptions import ConfigError, LockBackendError


if TYPE_CHECKING:
    from collections.abc import Sequence

    from resilient._backends._base import LockKey, OwnerToken, Renewal


__all__ = ["Command", "Commands", "Options", "backend_error", "parse_url"]

#: How long a released lease's hash keeps its fence (and nothing else).
TOMBSTONE_MS: Final = 1000

#: Leases renewed by one script (one round trip).
MAX_RENEW_BATCH: Final = 100

#: The default time limit of one call, in seconds (URL: ``timeout=``).
DEFAULT_TIMEOUT: Final = 2.0

_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# KEYS[1] the lease hash; ARGV[1] owner, ARGV[2] ttl in ms.
# -> {1, fence} granted (also when ARGV[1] already holds it), {0, pttl} busy.
_ACQUIRE = """\
local owner = redis.call('HGET', KEYS[1], 'o')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('HGET', KEYS[1], 'f')}
end
if owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('HGET', KEYS[1], 'f'))
if last and last >= fence then fence = last + 1 end
fence = string.format('%d', fence)
redis.call('HSET', KEYS[1], 'o', ARGV[1], 'f', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
"""

# KEYS[i] lease hashes; ARGV[2i-1] owner, ARGV[2i] ttl in ms.
# -> one 1 (renewed) or 0 (not ours any more) per key.
_RENEW = """\
local out = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('HGET', key, 'o') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# KEYS[1] the lease hash; ARGV[1] owner, ARGV[2] tombstone ms, ARGV[3]
# the lock's wake-up channel. -> 1 released (and waiters told), 0 not ours.
_RELEASE = """\
if redis.pcall('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'o')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], '')
  return 1
end
return 0
"""

_RETRYABLE: Final = frozenset(
    {"OOM", "READONLY", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN"}
    | {"CLUSTERDOWN", "connection", "timeout"}
)


@final
class Script:
    """A Lua script and its SHA-1 (the ``EVALSHA`` name)."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        digest = hashlib.sha1(source.encode(), usedforsecurity=False)
        self.sha = digest.hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.sha[:8]})"


ACQUIRE: Final = Script(_ACQUIRE)
RENEW: Final = Script(_RENEW)
RELEASE: Final = Script(_RELEASE)


@final
@attrs.frozen(repr=False)
class Command:
    """
    One script call: what to send. Its arguments hold owner tokens, so its
    repr shows only the script.
    """

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    limit: float

    def evalsha(self) -> tuple[str | int, ...]:
        return (
            "EVALSHA",
            self.script.sha,
            len(self.keys),
            *self.keys,
            *self.args,
        )

    def eval(self) -> tuple[str | int, ...]:
        return (
            "EVAL",
            self.script.source,
            len(self.keys),
            *self.keys,
            *self.args,
        )

    def __repr__(self) -> str:
        return f"Command({self.script!r}, {len(self.keys)} keys)"


@final
@attrs.frozen
class Options:
    """What a lock URL says, split into the driver's URL and ours."""

    driver_url: str = attrs.field(repr=url_repr)
    namespace: str
    timeout: float
    where: str
    secrets: tuple[str, ...] = attrs.field(default=(), repr=False)


def parse_url(url: str) -> Options:
    """
    Split our query parameters (``namespace``, ``timeout``) off *url*; the
    rest goes to redis-py. Errors name the parameter, never the URL.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    rest: list[tuple[str, str]] = []
    namespace = "resilient"
    timeout = DEFAULT_TIMEOUT
    for name, value in query:
        if name == "namespace":
            if not _NAMESPACE.fullmatch(value):
                raise ConfigError(
                    "redis URL namespace",
                    value[:64],
                    "must be 1-64 letters, digits or _ . : -",
                )
            namespace = value
        elif name == "timeout":
            timeout = url_seconds(value)
        else:
            rest.append((name, value))
    driver = parts._replace(
        query=urllib.parse.urlencode(rest, quote_via=urllib.parse.quote)
    ).geturl()
    return Options(
        driver, namespace, timeout, url_where(url), url_secrets(url)
    )


@final
class Commands:
    """The sans-IO layer: the scripts to run and how to read their replies."""

    __slots__ = ("namespace", "timeout")

    def __init__(self, namespace: str, timeout: float) -> None:
        self.namespace = namespace
        self.timeout = timeout

    def key(self, key: LockKey) -> str:
        """The Redis key of a lock's lease hash."""
        return f"{self.namespace}:lock:{{{key.hex}}}"

    def channel(self, key: LockKey) -> str:
        """The channel a release of the lock publishes on (its hash tag)."""
        return f"{self.namespace}:free:{{{key.hex}}}"

    def _limit(self, cap: float) -> float:
        return call_limit(cap, self.timeout)

    def acquire(self, key: LockKey, owner: OwnerToken, ttl: float) -> Command:
        return Command(
            ACQUIRE,
            (self.key(key),),
            (owner.hex, ttl_ms(ttl)),
            self._limit(ttl),
        )

    @staticmethod
    def read_acquire(reply: Any, ttl: float) -> Grant | Busy:
        granted, value = reply
        if granted == 1:
            return Grant(fence=int(value), ttl=ttl_ms(ttl) / 1000.0)
        pttl = int(value)
        return Busy(expires_in=pttl / 1000.0 if pttl >= 0 else None)

    def renew(self, batch: Sequence[Renewal]) -> Command:
        args: list[str | int] = []
        for r in batch:
            args += (r.owner.hex, ttl_ms(r.ttl))
        return Command(
            RENEW,
            tuple(self.key(r.key) for r in batch),
            tuple(args),
            self._limit(min(r.ttl for r in batch)),
        )

    @staticmethod
    def read_renew(reply: Any, n: int) -> list[bool]:
        if len(reply) != n:  # pragma: no cover - the script answers n
            raise LockBackendError(
                "redis",
                "reply",
                f"{len(reply)} results for {n} renewals",
                retryable=False,
            )
        return [r == 1 for r in reply]

    def release(self, key: LockKey, owner: OwnerToken) -> Command:
        return Command(
            RELEASE,
            (self.key(key),),
            (owner.hex, TOMBSTONE_MS, self.channel(key)),
            self._limit(math.inf),
        )

    @staticmethod
    def read_release(reply: Any) -> ReleaseResult:
        return ReleaseResult.RELEASED if reply == 1 else ReleaseResult.NOT_HELD


def backend_error(
    exc: BaseException, command: Command, store: Options | None = None
) -> LockBackendError:
    """The documented error for a redis-py exception (or an OSError)."""
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError):
        code = "NOAUTH"
    elif isinstance(exc, rx.BusyLoadingError):
        code = "LOADING"
    elif isinstance(exc, rx.TimeoutError | TimeoutError):
        code = "timeout"
    elif isinstance(exc, rx.ConnectionError | OSError):
        code = "connection"
    elif isinstance(exc, rx.ResponseError):
        code = getattr(exc, "status_code", None) or (
            str(exc).split(" ", 1)[0] or "ERR"
        )
        if not code.isupper():
            code = "ERR"
    else:
        code = type(exc).__name__
    message = str(exc)[:200] or type(exc).__name__
    for arg in command.args:
        # Defensive: an error text never carries an owner token.
        if isinstance(arg, str) and len(arg) >= 32:
            message = message.replace(arg, "(secret)")
    if store is not None:
        message = hide(message, store.secrets)
    return LockBackendError(
        "redis",
        code,
        message,
        retryable=code in _RETRYABLE,
        where=store.where if store else None,
    )


def _timed_out(command: Command, where: str) -> LockBackendError:
    return LockBackendError(
        "redis",
        "timeout",
        f"no reply within {command.limit:.3f} s",
        retryable=True,
        where=where,
    )
