"""
A function decorated with `resilient.singleflight` carries a handle on its
group: ``fn.group``, ``fn.statistics()`` and ``fn.forget(key)``, sync and
async, on functions and methods alike.
"""

from __future__ import annotations

from typing import Any

import pytest

import resilient
from tests.test_singleflight import Callers, wait_until


@pytest.fixture(params=["sync", "asyncio", "trio"])
def callers(request: pytest.FixtureRequest) -> Any:
    """Threads, asyncio tasks or trio tasks."""
    c = Callers(request.param)
    yield c
    c.close()


def test_a_decorated_function_has_its_groups_handle(
    callers: Callers,
) -> None:
    """
    ``fn.statistics()`` counts the calls in flight and those that joined,
    and ``fn.forget(key)`` (the key the key function gives) lets the next
    caller start a new execution while the one under way goes on: what a
    decorated function had no way to reach before.
    """
    work = callers.work()

    @resilient.singleflight(key=lambda user: user, name="users")
    async def aload(user: int) -> object:
        return await work.async_(user)

    @resilient.singleflight(key=lambda user: user, name="users")
    def sload(user: int) -> object:
        return work.sync(user)

    async def acall() -> object:
        return await aload(1)

    load: Any = aload if callers.is_async else sload
    call: Any = acall if callers.is_async else (lambda: sload(1))

    assert isinstance(load.group, resilient.SingleFlight)
    assert load.group.name == "users"
    assert load.statistics() == load.group.statistics()
    first = [callers.start(call), callers.start(call)]
    wait_until(lambda: load.statistics().waiting == 2)
    assert load.statistics().in_flight == 1
    assert 1 in load.group
    assert load.forget(1) is True
    assert load.forget(1) is False
    second = callers.start(call)
    wait_until(lambda: load.statistics().waiting == 3)
    assert load.statistics().executions == 2
    work.latch.open()
    assert first[0].result(10) is first[1].result(10)
    assert second.result(10) is not first[0].result(10)
    wait_until(lambda: load.statistics().running == 0)
    assert load.statistics().joined == 1


def test_a_given_group_is_the_handles_group() -> None:
    """With ``group=``, the handle is that group."""
    group = resilient.SingleFlight(name="shared")

    @resilient.singleflight(group=group)
    def load(user: int) -> int:
        return user

    assert load.group is group
    assert load(3) == 3
    assert load.statistics().executions == 1


def test_methods_reach_the_handle_through_the_instance() -> None:
    """
    A decorated method's handle is reachable from the class and from each
    instance (one group per function, shared by its instances), and so is
    a decorated classmethod's and staticmethod's.
    """

    class Repo:
        @resilient.singleflight(key=lambda self, user: user)
        def load(self, user: int) -> int:
            return user

        @classmethod
        @resilient.singleflight()
        def make(cls) -> str:
            return cls.__name__

        @staticmethod
        @resilient.singleflight()
        def plain(x: int) -> int:
            return x

    a, b = Repo(), Repo()
    assert a.load(1) == 1
    assert b.load(2) == 2
    assert a.load.group is b.load.group is Repo.load.group
    assert a.load.statistics().executions == 2
    assert a.load.forget(1) is False
    # mypy reads a classmethod over a callable protocol as unbound.
    assert Repo.make() == "Repo"  # type: ignore[call-arg]
    assert Repo.make.statistics().executions == 1
    assert Repo.plain(4) == 4
    assert Repo.plain.statistics().executions == 1
