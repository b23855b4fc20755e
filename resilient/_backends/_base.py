"""
The lock backend protocol: what a lease store does, in records.

A backend stores leases and mints fencing tokens; it does not wait, renew on
a schedule, or decide when a lease is lost (the lease machine in
`resilient._lock` does).
Every backend module ``resilient/_backends/_<scheme>.py`` defines
``EXTRA`` (the extra that installs its driver, or ``None``), and the two
factories ``sync_backend(url)`` and ``async_backend(url)``, which return a
`LockBackend` and an `AsyncLockBackend`.
The two may share one sans-IO command layer (the SQL or Lua and the parsing
of replies, written once) under two thin I/O adapters.

Contract every backend keeps (``tests/lock_contract.py`` checks it):

* `acquire` grants a free or expired lease in one atomic step that also mints
  the fencing token: the token is strictly greater than every token granted
  for that key before, also after the lease's row or key was deleted, and the
  storage per key is bounded (nothing is kept for a key nobody holds).
* An `acquire` by the owner that already holds the lease grants it again
  (refreshed to the new ttl) with a token at least the one it holds: a
  retried acquire after a lost reply recognises its own owner.
* `renew` is a compare-and-set on the owner, one result per request, in
  order; a lease that expired on the store is not renewed.
* `release` is a compare-and-delete on the owner; releasing twice, or a
  lease that expired or was taken over, answers `ReleaseResult.NOT_HELD`.
* Any exception from `acquire`, `renew` or `release` means "no answer": the
  outcome is unknown. The caller treats it so (retries within its deadline,
  or leaves the lease to expire); a backend never reports success it did not
  see.
* `watch` never blocks and never raises; its *notify* may run on any thread,
  spuriously or more than once, and must be cheap.
* The owner token never appears in a repr, log line, span, metric or
  exception message; `OwnerToken` hides it from ``repr`` and ``str``.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
import secrets
import urllib.parse
from typing import TYPE_CHECKING, Final, Protocol, final

import attrs

from resilient._core._clock import remaining
from resilient._core._shown import NAME_LIMIT, shown
from resilient.exceptions import ConfigError


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


__all__ = [
    "AsyncLockBackend",
    "Busy",
    "Grant",
    "LockBackend",
    "LockKey",
    "OwnerToken",
    "ReleaseResult",
    "Renewal",
]

#: Random bytes in an owner token (160 bits, above the 128 the issue asks).
OWNER_BYTES: Final = 20

#: Seconds a waiter behind others in its process's line sleeps unless woken.
QUEUED_LOOK: Final = 1.0

#: How much of a lock's name reprs, spans and errors show.
SHOWN_NAME: Final = NAME_LIMIT


@final
class OwnerToken:
    """
    Who holds a lease: random bytes from `secrets`, a secret.

    Its ``repr`` and ``str`` never show the bytes; a backend reads them from
    `secret` (as bytes) or `hex` (as text), and nothing else should.
    Compared by value in constant time.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = (
            secrets.token_bytes(OWNER_BYTES) if secret is None else secret
        )

    @property
    def secret(self) -> bytes:
        """The token's bytes, for the backend's compare-and-set only."""
        return self._secret

    @property
    def hex(self) -> str:
        """The token as lowercase hex, for backends that store text."""
        return self._secret.hex()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OwnerToken):
            return NotImplemented
        return secrets.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self._secret)

    def __repr__(self) -> str:
        return "<OwnerToken (secret)>"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        # A token must not travel: pickling it (into a log record, a task
        # queue) would leak it.
        raise TypeError("an OwnerToken cannot be pickled")


@final
@attrs.frozen(repr=False)
class LockKey:
    """
    A lock's name and the safe key derived from it.

    The key is the SHA-256 of the name's UTF-8 bytes (lone surrogates
    encoded as they are, so every distinct `str` has distinct bytes): any
    content and any length give 64 hex digits, which are safe as a file
    name, an SQL value, a Redis key (no glob or hash-tag characters) and a
    PostgreSQL key. Names are not normalised: NFC and NFD spellings of one
    text are two locks.

    Attributes:
        name: The name as the user gave it (for display: see `shown`).
        digest: The 32-byte SHA-256 digest.
        hex: The digest as 64 lowercase hex digits.
    """

    name: str
    digest: bytes
    hex: str

    @classmethod
    def of(cls, name: str) -> LockKey:
        """The key of *name* (a `str`; callers validate the type)."""
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
        return cls(name=name, digest=digest, hex=digest.hex())

    @property
    def shown(self) -> str:
        """The name, cut to `SHOWN_NAME` characters, for messages."""
        return shown(self.name)

    @property
    def int64(self) -> int:
        """The first 8 bytes of the digest as a signed 64-bit integer."""
        return int.from_bytes(self.digest[:8], "big", signed=True)

    def __repr__(self) -> str:
        return f"LockKey({self.shown!r})"


@final
@attrs.frozen
class Grant:
    """
    The store granted the lease.

    Attributes:
        fence: The fencing token minted with this grant: an int, strictly
            greater than every token granted for this key before.
        ttl: The time to live the store applied, in seconds (it may round
            the requested one up, never down: Redis counts milliseconds).
    """

    fence: int
    ttl: float


@final
@attrs.frozen
class Busy:
    """
    Someone else holds the lease.

    Attributes:
        expires_in: Seconds until the holder's lease expires on the store
            if it is not renewed, when the store says (else `None`); a
            waiter need not look again before then unless woken.
        queued: Answered by this process's line for the lock, not the
            store: others in this process wait ahead of this waiter, which
            is woken when it heads the line (it looks again only after
            `QUEUED_LOOK` seconds, as a safety net).
    """

    expires_in: float | None = None
    queued: bool = False


@final
@attrs.frozen(repr=False)
class Renewal:
    """
    One lease to renew: extend *key*'s lease to *ttl* if *owner* holds it.

    Attributes:
        key: The lock's key.
        owner: Our owner token (a secret: not in the repr).
        ttl: The new time to live, in seconds, from when the store applies it.
    """

    key: LockKey
    owner: OwnerToken
    ttl: float

    def __repr__(self) -> str:
        return f"Renewal({self.key!r}, ttl={self.ttl!r})"


class ReleaseResult(enum.Enum):
    """What a release learned."""

    #: The store deleted our lease.
    RELEASED = "released"
    #: The lease was not ours any more (released before, expired, taken).
    NOT_HELD = "not_held"
    #: No answer: the lease is left to expire (only the shell says this;
    #: a backend raises instead).
    UNKNOWN = "unknown"


class LockBackend(Protocol):
    """
    A lease store for sync code.

    Attributes:
        scheme: The URL scheme it serves, like ``"sqlite"`` (for spans and
            messages; never the URL itself, which may hold a password).
        max_renew_batch: How many leases one `renew` call takes at most;
            the renewer splits bigger batches.
    """

    scheme: str
    max_renew_batch: int

    def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """
        Grant *key* to *owner* for *ttl* seconds if it is free or expired
        (or already *owner*'s), minting a fencing token in the same step.
        """
        ...

    def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        """
        Extend each lease its owner still holds; one result per request, in
        order: `True` renewed, `False` gone (expired, released, taken).
        Many leases in one round trip where the store allows.
        """
        ...

    def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """
        Delete *key*'s lease if *owner* holds it (`ReleaseResult.RELEASED`),
        else `ReleaseResult.NOT_HELD`. Harmless to repeat.
        """
        ...

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """
        Call *notify* (from any thread) when *key* may have become free;
        return a function that stops watching. A store that cannot tell
        returns a no-op: waiters then look again on their backoff.
        """
        ...

    def close(self) -> None:
        """Let go of connections and files; leases are not released."""
        ...


class AsyncLockBackend(Protocol):
    """
    A lease store for async code: `LockBackend` with awaitable I/O.

    `watch` stays a plain method (it must not block). The object belongs
    to the event loop that made it.
    """

    scheme: str
    max_renew_batch: int

    async def acquire(
        self, key: LockKey, owner: OwnerToken, ttl: float
    ) -> Grant | Busy:
        """See `LockBackend.acquire`."""
        ...

    async def renew(self, batch: Sequence[Renewal]) -> Sequence[bool]:
        """See `LockBackend.renew`."""
        ...

    async def release(self, key: LockKey, owner: OwnerToken) -> ReleaseResult:
        """See `LockBackend.release`."""
        ...

    def watch(
        self, key: LockKey, notify: Callable[[], None]
    ) -> Callable[[], None]:
        """See `LockBackend.watch`."""
        ...

    async def aclose(self) -> None:
        """See `LockBackend.close`."""
        ...


def no_watch(key: LockKey, notify: Callable[[], None]) -> Callable[[], None]:  # noqa: ARG001
    """A `watch` for stores that cannot tell when a lease is freed."""
    return _nothing


def _nothing() -> None:
    """The unsubscribe of `no_watch`."""


# What the server backends (Redis, PostgreSQL) share: how a ttl is sent,
# how a URL's timeout is read, and how long one call may take.

MIN_LIMIT: Final = 0.25
"""The shortest time limit a ttl gives a call, in seconds."""


def ttl_ms(ttl: float) -> int:
    """*ttl* seconds in whole milliseconds, rounded up, at least 1."""
    return max(1, math.ceil(round(ttl * 1000.0, 6)))


def url_seconds(value: str) -> float:
    """A lock URL's ``timeout=`` option, in seconds (> 0, finite)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise ConfigError(
            "lock URL timeout", value[:32], "must be seconds > 0"
        )
    return seconds


def url_where(url: str) -> str:
    """
    Where a store is, for error messages: the URL's host and port, never
    its user name, password, path or query (``"(default host)"`` when the
    URL names none, as libpq then uses its own defaults).
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "(unreadable host)"
    if not host:
        return "(default host)"
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port else shown


_PASSWORD_PARAMETER: Final = re.compile(
    r"(?i)(^|&)((?:ssl)?pass(?:word|wd)?)=[^&]*"
)


def shown_url(url: str) -> str:
    """
    *url* as reprs may show it: its password (in the user part, or a
    ``password=`` query parameter) replaced by ``***``, as in
    ``redis://:***@host`` and ``postgresql://user:***@host/db``.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(unreadable URL)"
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = _PASSWORD_PARAMETER.sub(r"\1\2=***", parts.query)
    return parts._replace(netloc=netloc, query=query).geturl()


def url_repr(url: object) -> str:
    """The repr of a URL field (`shown_url`), for attrs' ``repr=``."""
    return repr(shown_url(url)) if isinstance(url, str) else repr(url)


def url_secrets(url: str) -> tuple[str, ...]:
    """The URL's password as written and decoded, to cut from messages."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return ()
    if not password:
        return ()
    return tuple({password, urllib.parse.unquote(password)})


def hide(message: str, secrets: tuple[str, ...]) -> str:
    """*message* with every one of *secrets* replaced by ``(secret)``."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "(secret)")
    return message


def call_limit(cap: float, timeout: float) -> float:
    """
    How long one call to a store may take: the enclosing deadline, the
    store's *timeout*, and *cap* (a lease's ttl: a reply later than that is
    of no use, as the holder would count it invalid), but never less than
    `MIN_LIMIT` for a tiny ttl, so it cannot starve the round trip.
    """
    return max(min(remaining(), max(cap, MIN_LIMIT), timeout), 0.0)
