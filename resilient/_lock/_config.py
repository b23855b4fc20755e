"""
A lock's configuration: plain, frozen, validated data.

The lease machine is in `resilient._lock._machine`, the shells in
`resilient._lock._lock`; this module holds only what a user configures.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypedDict, final

import attrs

from resilient._backends._base import url_repr
from resilient._core._backoff import FullJitter
from resilient._core._keywords import settings_checked
from resilient._core._validate import check_number, field_name, to_seconds
from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    import datetime as dt

    from resilient.typing import Backoff


#: The environment variable that names the default lock backend's URL.
ENV_URL: Final = "RESILIENT_LOCK_URL"

#: The largest TTL: Redis counts milliseconds in a signed 64-bit integer,
#: and a float of seconds must still tell milliseconds apart.
MAX_TTL: Final = 2.0**52 / 1000


def default_lock_dir() -> Path:
    """
    Where the embedded default keeps its database and lock files:
    ``~/.cache/resilient/locks`` of this process's effective uid, its home
    read from the user database (``pwd``), not from the environment.

    One store per user whatever the environment: a cron job (no
    ``XDG_RUNTIME_DIR``, maybe no ``XDG_CACHE_HOME``), an ssh session
    (with them) and ``sudo`` (which may keep the caller's ``HOME``) of the
    same uid must exclude each other, so no environment variable chooses
    the directory. Not ``/run/user/$UID`` (removed at logout, under a
    holder) and not ``/tmp`` (cleaners remove old files there). ``$HOME``
    only for a uid the user database does not know (a container).
    """
    import pwd  # noqa: PLC0415 - POSIX only, like the store itself

    uid = os.geteuid()
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = os.environ.get("HOME", "")
    if not home or not home.startswith("/"):
        raise ConfigError(
            "LockConfig.backend",
            None,
            f"has no default: uid {uid} has no home directory; set "
            f"${ENV_URL} or pass backend=",
        )
    return Path(home) / ".cache" / "resilient" / "locks"


def default_backend_url() -> str:
    """
    The URL a lock uses when none is given: ``$RESILIENT_LOCK_URL`` if set,
    else the embedded SQLite file ``locks.sqlite3`` in `default_lock_dir`.
    """
    url = os.environ.get(ENV_URL)
    if url:
        return url
    return f"sqlite:///{default_lock_dir() / 'locks.sqlite3'}"


def _ttl(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_number(inst, attribute, value, strict=True, maximum=MAX_TTL)


def _seconds_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, strict=True, allow_none=True)


def _non_negative_or_none(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    check_number(inst, attribute, value, allow_none=True)


def _backend(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is None:
        return
    from resilient._backends import scheme_of  # noqa: PLC0415

    scheme_of(value, field_name(inst, attribute))


def _backoff(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if not callable(getattr(value, "delay", None)):
        raise ConfigTypeError(
            field_name(inst, attribute),
            value,
            "must be a backoff strategy (an object with a delay() method)",
        )


@final
@settings_checked
@attrs.frozen(kw_only=True)
class LockConfig:
    """
    How a lock leases, renews and waits.

    Frozen and validated at construction: a bad value raises `ConfigError`
    or `ConfigTypeError` naming the field and the value. Durations are
    seconds (floats or ints) or `datetime.timedelta`.

    Args:
        ttl: How long a lease lives on the store without renewal: how long
            others wait after a holder dies or hangs. 30 s by default (the
            lease of Redisson's watchdog and of .NET's DistributedLock).
        renew_interval: Seconds between renewals while held; None (the
            default) is ``ttl / 3``. Must leave room for the drift margin:
            ``renew_interval + drift < ttl``.
        drift: Seconds taken off the lease's validity on the holder's side,
            for clock rate differences and the store's own delays; None (the
            default) is ``max(ttl / 100, 0.002)``. The holder counts its lease
            lost at ``sent + ttl - drift`` on its monotonic clock, *sent*
            being when the acquire request left, so it gives up before the
            store could grant the lock to anyone else.
        timeout: Seconds to wait for a held lock before `LockNotAcquired`;
            None waits as long as the enclosing `resilient.deadline` allows
            (without one, for ever: pass it on purpose). 10 s by default, so
            no wait is unbounded unless asked for.
        blocking: False tries once and raises `LockNotAcquired` at once if
            the lock is held (the same as ``timeout=0``).
        backoff: How long a waiter sleeps between tries when the store
            cannot wake it (it is woken at once where it can: the embedded
            and memory backends), never past the holder's expiry or the
            deadline. Full jitter from 5 ms to 0.5 s by default.
        backend: The store's URL: ``sqlite:///path``, ``memory://``,
            ``redis://...``, ``postgresql://...``; None (the default) is
            ``$RESILIENT_LOCK_URL`` or the embedded SQLite file (see
            `default_backend_url`), looked up when the lock is made.

    .. versionadded:: 26.11.0
    """

    ttl: float = attrs.field(
        default=30.0, converter=to_seconds, validator=_ttl
    )
    renew_interval: float | None = attrs.field(
        default=None, converter=to_seconds, validator=_seconds_or_none
    )
    drift: float | None = attrs.field(
        default=None, converter=to_seconds, validator=_non_negative_or_none
    )
    timeout: float | None = attrs.field(
        default=10.0, converter=to_seconds, validator=_non_negative_or_none
    )
    blocking: bool = attrs.field(default=True)
    backoff: Backoff = attrs.field(
        factory=lambda: FullJitter(base=0.005, cap=0.5), validator=_backoff
    )
    backend: str | None = attrs.field(
        default=None, validator=_backend, repr=url_repr
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.blocking, bool):
            raise ConfigTypeError(
                "LockConfig.blocking", self.blocking, "must be a bool"
            )
        if self.renew_interval is not None and self.renew_interval >= self.ttl:
            raise ConfigError(
                "LockConfig.renew_interval",
                self.renew_interval,
                f"must be < ttl ({self.ttl:g} s)",
            )
        if self.drift is not None and self.drift >= self.ttl:
            raise ConfigError(
                "LockConfig.drift",
                self.drift,
                f"must be < ttl ({self.ttl:g} s)",
            )
        if self.every + self.margin >= self.ttl:
            raise ConfigError(
                "LockConfig.renew_interval",
                self.every,
                f"plus the drift margin ({self.margin:g} s) must be < ttl "
                f"({self.ttl:g} s)",
            )

    @property
    def every(self) -> float:
        """The renewal interval in effect, in seconds."""
        return (
            self.ttl / 3
            if self.renew_interval is None
            else self.renew_interval
        )

    @property
    def margin(self) -> float:
        """The drift margin in effect, in seconds."""
        if self.drift is not None:
            return self.drift
        return min(max(self.ttl / 100, 0.002), self.ttl / 10)

    @property
    def wait(self) -> float:
        """The lock's own longest wait, in seconds (`math.inf`: none)."""
        if not self.blocking:
            return 0.0
        return math.inf if self.timeout is None else self.timeout


class LockKnobs(TypedDict, total=False):
    """The keyword arguments `LockConfig` takes, typed."""

    ttl: float | dt.timedelta
    renew_interval: float | dt.timedelta | None
    drift: float | dt.timedelta | None
    timeout: float | dt.timedelta | None
    blocking: bool
    backoff: Backoff
    backend: str | None
