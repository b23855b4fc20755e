"""
The storm harness itself (`tests/storm.py`): it throws what it says, counts
each landing once, and catches the leaks it exists to catch.
"""

from __future__ import annotations

import threading

import pytest

import resilient

from .storm import Storm, interrupt_storm, storm, untraced


@untraced
def test_every_exception_lands_once() -> None:
    """A body with nothing to leak sees every thrown exception land."""
    result = storm(lambda: None, exceptions=300, threads=2, seed=1)
    result.check()
    assert result.fired == result.landed == 300


@untraced
def test_a_leak_is_seen() -> None:
    """A body whose bookkeeping is not exception-safe leaks under a storm."""
    held = [0]
    lock = threading.Lock()

    def leaky() -> None:
        with lock:
            held[0] += 1
        for _ in range(20):
            pass
        with lock:
            held[0] -= 1

    storm(leaky, exceptions=300, seed=2).check()
    assert held[0] > 0


@untraced
def test_a_swallowed_exception_is_reported() -> None:
    """A body that swallows the storm's exception fails `check`."""

    def swallow() -> None:
        try:
            for _ in range(1000):
                pass
        except Storm:
            pass

    result = storm(swallow, exceptions=3, patience=0.05, seed=3)
    assert result.swallowed > 0
    with pytest.raises(AssertionError):
        result.check()


@untraced
def test_a_replaced_exception_is_reported() -> None:
    """An exception raised in place of the storm's own fails `check`."""

    def replace() -> None:
        try:
            for _ in range(1000):
                pass
        except Storm as exc:
            raise RuntimeError("replaced") from exc

    result = storm(replace, exceptions=5, seed=4)
    # Most land inside the try; one landing on the function's entry
    # comes out as itself.
    assert result.replaced
    assert len(result.replaced) + result.landed == 5
    with pytest.raises(AssertionError):
        result.check()


@untraced
def test_finish_runs_in_each_worker() -> None:
    """*finish* runs once per worker thread, after the storm."""
    seen: list[int] = []
    result = storm(
        lambda: None,
        exceptions=10,
        threads=3,
        finish=lambda: seen.append(threading.get_ident()),
    )
    result.check()
    assert len(set(seen)) == 3


def test_interrupt_storm_fires_each_scope() -> None:
    """Each interrupting scope of the main-thread storm ends in TimedOut."""
    result = interrupt_storm(lambda: None, firings=50, seed=5)
    result.check()
    assert result.landed == 50


def test_interrupt_storm_reports_a_replaced_firing() -> None:
    """A body that turns the interrupt into another error is reported."""

    def body() -> None:
        try:
            resilient.checkpoint()
            for _ in range(100):
                pass
        except BaseException as exc:
            raise RuntimeError("replaced") from exc

    result = interrupt_storm(body, firings=20, seed=6)
    assert result.replaced
    assert not result.errors
    with pytest.raises(AssertionError):
        result.check()
