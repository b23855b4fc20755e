"""
Breakers by name, through the public API: one live breaker per name
whatever happens, provisional breakers that adopt the first real
configuration, conflicts that name the differing field, resets that reach
every holder, and bounded memory for a million names.
"""

from __future__ import annotations

import contextvars
import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import resilient
from resilient import (
    BreakerConfig,
    CircuitBreaker,
    ConfigError,
    ConfigTypeError,
    CountWindow,
)
from resilient._breaker import _REGISTRY, REGISTRY, get_breaker
from tests.breakers import small


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    resilient.testing.reset_registries()
    yield
    resilient.testing.reset_registries()
    REGISTRY.limit = 1024


def _tripping(**changes: Any) -> BreakerConfig:
    """Opens on 2 failures of the last 4 calls."""
    base: dict[str, Any] = {
        "window": CountWindow(4),
        "minimum_calls": 2,
        "open_interval": 10.0,
    }
    base.update(changes)
    return BreakerConfig(**base)


def _fail(cb: resilient.CircuitBreaker, times: int = 2) -> None:
    for _ in range(times):
        cb.acquire().failure(ConnectionError())


class TestProvisional:
    def test_looking_at_state_does_not_block_a_policy(
        self, clock: Any
    ) -> None:
        """
        ``breaker("p").state`` before ``Policy(name="p", breaker=...)``:
        the policy's configuration wins, on the very same breaker.
        """
        looked = resilient.breaker("p")
        assert looked.state is resilient.BreakerState.CLOSED
        policy = resilient.Policy(
            name="p",
            attempts=1,
            breaker=_tripping(),
            retry_on=ConnectionError,
        )

        @resilient.retry(policy)
        def down() -> None:
            raise ConnectionError

        for _ in range(2):
            with pytest.raises(ConnectionError):
                down()
        assert resilient.breaker("p") is looked
        assert looked.config == _tripping()
        assert looked.state is resilient.BreakerState.OPEN

    def test_order_does_not_matter(self) -> None:
        """Configured first, looked at later: the same breaker."""
        configured = resilient.breaker("q", _tripping())
        assert resilient.breaker("q") is configured
        assert configured.config == _tripping()

    def test_a_breaker_that_saw_calls_conflicts(self, clock: Any) -> None:
        """
        A provisional breaker that already counted calls keeps its
        configuration; the error names the differing field and stays
        short.
        """
        cb = resilient.breaker("used")
        cb.acquire().failure(ConnectionError())
        with pytest.raises(ConfigError) as info:
            resilient.breaker("used", BreakerConfig(open_interval=5))
        text = str(info.value)
        assert "open_interval: 30.0 != 5.0" in text
        assert len(text) < 400
        assert info.value.field == "breaker('used').config"

    def test_explicit_configurations_conflict_naming_fields(self) -> None:
        """Two explicit configurations that differ: both fields named."""
        resilient.breaker("two", _tripping())
        with pytest.raises(ConfigError) as info:
            resilient.breaker(
                "two", _tripping(minimum_calls=3, failure_rate=0.25)
            )
        text = str(info.value)
        assert "minimum_calls: 2 != 3" in text
        assert "failure_rate: 0.5 != 0.25" in text
        assert len(text) < 500

    def test_equal_lambdas_do_not_conflict(self) -> None:
        """
        Two equal configurations made by the same code, each with its own
        lambda object, are the same configuration.
        """

        def config() -> BreakerConfig:
            return BreakerConfig(failure_on=lambda exc: "503" in str(exc))

        cb = resilient.breaker("lambdas", config())
        assert resilient.breaker("lambdas", config()) is cb


class TestDefaults:
    def test_named_default_after_the_breaker_exists(self) -> None:
        """
        ``set_breaker_defaults(name=...)`` for a breaker looked at but
        unused: adopted in place.
        """
        cb = resilient.breaker("late")
        resilient.set_breaker_defaults(_tripping(), name="late")
        assert cb.config == _tripping()
        assert resilient.breaker("late") is cb

    def test_named_default_that_would_do_nothing_raises(
        self, clock: Any
    ) -> None:
        """
        Once the breaker has seen calls, a named default could change
        nothing: the call says so instead of being silently ignored.
        """
        cb = resilient.breaker("busy")
        cb.acquire().success()
        with pytest.raises(ConfigError, match="no effect") as info:
            resilient.set_breaker_defaults(_tripping(), name="busy")
        assert "minimum_calls: 5 != 2" in str(info.value)

    def test_bad_default_arguments(self) -> None:
        """The config and the name are checked, naming the argument."""
        with pytest.raises(resilient.ConfigTypeError, match="config"):
            resilient.set_breaker_defaults("x")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="empty"):
            resilient.set_breaker_defaults(_tripping(), name=" ")


class TestIdentity:
    def test_reset_reaches_a_decorated_function(self, clock: Any) -> None:
        """
        ``reset_registries()`` resets the breaker a decorated function
        captured, and the name still gives that breaker: nothing leaks
        into the next test and the two never disagree.
        """
        cb = resilient.breaker("captured", _tripping())

        @cb
        def down() -> None:
            raise ConnectionError

        for _ in range(2):
            with pytest.raises(ConnectionError):
                down()
        assert cb.state is resilient.BreakerState.OPEN
        resilient.testing.reset_registries()
        assert cb.state is resilient.BreakerState.CLOSED
        assert resilient.breaker("captured", _tripping()) is cb
        with pytest.raises(ConnectionError):
            down()
        assert resilient.breaker("captured").statistics().failures == 1

    def test_open_breaker_never_duplicated(self, clock: Any) -> None:
        """
        An open breaker nobody holds survives any number of other names
        past the bound: the name gives the same (still open) breaker.
        """
        REGISTRY.limit = 8
        cb = resilient.breaker("open", _tripping())
        _fail(cb)
        ident = id(cb)
        del cb
        for i in range(100):
            resilient.breaker(f"other-{i}")
        gc.collect()
        again = resilient.breaker("open")
        assert id(again) == ident
        assert again.state is resilient.BreakerState.OPEN
        again.reset()
        del again
        for i in range(100):
            resilient.breaker(f"more-{i}")
        gc.collect()
        assert REGISTRY.peek("open") is None  # Closed: let go.

    def test_held_breaker_never_duplicated(self) -> None:
        """A breaker held elsewhere is the one its name gives."""
        REGISTRY.limit = 2
        held = resilient.breaker("held")
        for i in range(50):
            resilient.breaker(f"n-{i}")
        gc.collect()
        assert resilient.breaker("held") is held

    def test_concurrent_first_lookups(self) -> None:
        """16 threads asking for one new name get one breaker."""
        barrier = threading.Barrier(16)
        got: list[resilient.CircuitBreaker] = []

        def worker() -> None:
            barrier.wait()
            got.append(resilient.breaker("race"))

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(cb) for cb in got}) == 1


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="Linux")
def test_many_names_through_every_form() -> None:
    """
    80,000 distinct names, a quarter each through ``breaker(name)``,
    ``with``, ``async with`` and the decorator: the process keeps far less
    than 50 MB, the registry at most its bound, and the context gains no
    key per name. (The report measures 1,000,000; this keeps CI short.)
    """
    resilient.set_breaker_defaults(
        BreakerConfig(window=CountWindow(1), minimum_calls=1)
    )
    keys_before = len(contextvars.copy_context())
    gc.collect()
    base = _rss()

    def plain(i: int) -> None:
        resilient.breaker(f"plain-{i}")

    def with_form(i: int) -> None:
        with resilient.breaker(f"with-{i}"):
            pass

    def decorated(i: int) -> None:
        resilient.breaker(f"dec-{i}")(int)(i)

    for i in range(20_000):
        plain(i)
        with_form(i)
        decorated(i)

    async def tasks() -> None:
        for i in range(20_000):
            async with resilient.breaker(f"async-{i}"):
                pass

    anyio.run(tasks)
    assert len(contextvars.copy_context()) <= keys_before + 1
    gc.collect()
    grown = _rss() - base
    assert grown < 50 * 2**20, grown
    assert len(REGISTRY) <= REGISTRY.limit + 1


class TestRegistry:
    def test_one_breaker_per_name(self) -> None:
        """The same name gives the same breaker; get_breaker is breaker."""
        a = resilient.breaker("db")
        assert resilient.breaker("db") is a
        assert get_breaker("db") is a
        assert resilient.breaker("db", BreakerConfig()) is a
        assert resilient.breaker("other") is not a
        assert repr(a) == "<CircuitBreaker 'db' closed>"

    def test_different_config_refused(self) -> None:
        """Asking for an existing breaker with another config raises."""
        resilient.breaker("db", small())
        assert resilient.breaker("db", small()).config == small()
        with pytest.raises(ConfigError, match=r"breaker\('db'\)\.config"):
            resilient.breaker("db", BreakerConfig())

    @pytest.mark.parametrize(
        ("name", "config", "error", "match"),
        [
            (3, None, ConfigTypeError, "breaker.name."),
            ("  ", None, ConfigError, "must not be empty"),
            ("x", {"open_interval": 1}, ConfigTypeError, "BreakerConfig"),
        ],
    )
    def test_bad_arguments(
        self, name: Any, config: Any, error: type[Exception], match: str
    ) -> None:
        """A bad name or config is refused, naming it."""
        with pytest.raises(error, match=match):
            resilient.breaker(name, config)
        with pytest.raises(error, match=match):
            CircuitBreaker(name, config)

    def test_registered_defaults(self) -> None:
        """Breakers made without a config take the name's defaults, then
        the global ones, then BreakerConfig(); existing ones keep theirs."""
        early = resilient.breaker("early")
        resilient.set_breaker_defaults(small())
        resilient.set_breaker_defaults(
            small(open_interval=99.0), name="payments"
        )
        assert resilient.breaker("payments").config.open_interval == 99.0
        assert resilient.breaker("search").config == small()
        assert early.config == BreakerConfig()
        with pytest.raises(ConfigTypeError):
            resilient.set_breaker_defaults("x")  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            resilient.set_breaker_defaults(small(), name="")

    def test_bounded_but_open_breakers_kept(self, clock: Any) -> None:
        """Past the bound, the least recently used closed breakers are let
        go; open ones never are."""
        _REGISTRY.limit = 3
        hot = resilient.breaker("hot", small())
        for _ in range(2):
            hot.acquire().failure(ConnectionError())
        for i in range(5):
            resilient.breaker(f"b{i}")
        kept = _REGISTRY.kept()
        # The bound keeps the 3 most recent; the open one is pinned too.
        assert kept == ["b2", "b3", "b4", "hot"]
        gc.collect()
        assert resilient.breaker("hot") is hot

    def test_held_breaker_still_found(self) -> None:
        """A breaker let go by the bound but still held elsewhere is the
        one the name gives: one name never has two live breakers."""
        _REGISTRY.limit = 1
        held = resilient.breaker("held")
        resilient.breaker("next")
        assert "held" not in _REGISTRY.kept()
        assert resilient.breaker("held") is held

    def test_breaker_opening_is_kept(self, clock: Any) -> None:
        """A breaker that opens after being let go is kept again."""
        _REGISTRY.limit = 1
        cb = resilient.breaker("later", small())
        resilient.breaker("next")
        for _ in range(2):
            cb.acquire().failure(ConnectionError())
        assert "later" in _REGISTRY.kept()
        stray = CircuitBreaker("stray", small())
        stray.force_open()
        assert "stray" not in _REGISTRY.kept()
        _REGISTRY.clear()  # Forgotten by the registry, still held here:
        cb.reset()
        cb.force_open()  # opening does not bring it back.
        assert _REGISTRY.kept() == []


def test_an_interrupted_pin_heals_on_the_next_rejection(clock: Any) -> None:
    """
    An open breaker whose pin an exception interrupted (it reads
    unpinned) is pinned again by the next call it rejects.
    """
    REGISTRY.limit = 1
    cb = resilient.breaker("heal", _tripping())
    _fail(cb)
    REGISTRY.unpin("heal", cb)
    cb._pinned = False
    with pytest.raises(resilient.CircuitOpen):
        cb.acquire()
    assert "heal" in REGISTRY.kept()
