"""The one registry of named stateful parts (resilient._core._registry)."""

from __future__ import annotations

import gc
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest

from resilient._core import _registry
from resilient._core._registry import Registry, differences, same_config
from resilient.exceptions import ConfigError, ConfigTypeError


@attrs.frozen
class _Config:
    size: int = 1
    check: Any = None


class _Item:
    """A stand-in for a breaker: a name, a config and some state."""

    __slots__ = ("__weakref__", "config", "name", "used")

    def __init__(self, name: str, config: _Config) -> None:
        self.name = name
        self.config = config
        self.used = 0


def _adopt(item: _Item, config: _Config) -> bool:
    if item.used:
        return False
    item.config = config
    return True


def _reset(item: _Item) -> None:
    item.used = 0


def _registry_of(limit: int = 4, **kw: Any) -> Registry[_Item, _Config]:
    return Registry(
        "item",
        _Item,
        _Config,
        config_of=lambda i: i.config,
        adopt=kw.pop("adopt", _adopt),
        reset=_reset,
        limit=limit,
        register=False,
        **kw,
    )


def test_one_live_instance_per_name_past_the_limit() -> None:
    """An item something still holds is found again after the registry
    stopped keeping it: never two live items for one name."""
    reg = _registry_of(limit=2)
    held = reg.get("a")
    for i in range(100):
        reg.get(f"n{i}")
    assert "a" not in reg.kept()
    assert reg.get("a") is held


def test_unheld_items_beyond_the_limit_are_forgotten() -> None:
    """Memory is bounded: items nobody holds go once past the limit."""
    reg = _registry_of(limit=3)
    for i in range(50):
        reg.get(f"n{i}")
    gc.collect()
    assert len(reg) == 3
    assert reg.kept() == ["n47", "n48", "n49"]


def test_pinned_items_are_kept_until_unpinned() -> None:
    """A busy item (an open breaker, a held lock) is never dropped."""
    reg = _registry_of(limit=1)
    busy = reg.get("busy")
    reg.pin("busy", busy)
    busy_id = id(busy)
    del busy
    for i in range(20):
        reg.get(f"n{i}")
    gc.collect()
    again = reg.peek("busy")
    assert again is not None
    assert id(again) == busy_id
    reg.unpin("busy", again)
    del again
    reg.get("other")
    gc.collect()
    assert reg.peek("busy") is None


def test_pin_of_a_stale_item_is_ignored() -> None:
    """Pinning an item that is not the live one for its name does nothing."""
    reg = _registry_of()
    stale = _Item("x", _Config())
    reg.pin("x", stale)
    reg.unpin("x", stale)
    assert reg.kept() == []


def test_peek_never_creates() -> None:
    """Looking without creating returns None for an unknown name."""
    reg = _registry_of()
    assert reg.peek("nope") is None
    assert len(reg) == 0
    item = reg.get("yes")
    assert reg.peek("yes") is item


def test_provisional_item_adopts_the_first_explicit_config() -> None:
    """Looking at state first (made with defaults) never blocks a later
    real configuration: the item adopts it and keeps its identity."""
    reg = _registry_of()
    looked = reg.get("p")
    real = _Config(size=5)
    assert reg.get("p", real) is looked
    assert looked.config is real
    with pytest.raises(ConfigError, match=r"size: 5 != 6"):
        reg.get("p", _Config(size=6))


def test_provisional_item_that_saw_work_conflicts() -> None:
    """An item that already did work cannot change configuration."""
    reg = _registry_of()
    item = reg.get("p")
    item.used = 1
    with pytest.raises(ConfigError) as info:
        reg.get("p", _Config(size=2))
    assert info.value.field == "item('p').config"
    assert "size: 1 != 2" in str(info.value)


def test_without_adopt_a_provisional_item_conflicts() -> None:
    """A kind that cannot reconfigure in place reports the conflict."""
    reg = _registry_of(adopt=None)
    reg.get("p")
    with pytest.raises(ConfigError, match="size"):
        reg.get("p", _Config(size=2))


def test_explicit_then_none_accepts_what_it_has() -> None:
    """Asking with no configuration accepts the existing one."""
    reg = _registry_of()
    item = reg.get("p", _Config(size=3))
    assert reg.get("p") is item
    assert item.config.size == 3


def test_explicit_same_config_makes_item_explicit() -> None:
    """An equal explicit configuration settles a provisional item."""
    reg = _registry_of()
    item = reg.get("p")
    reg.get("p", _Config())
    with pytest.raises(ConfigError):
        reg.get("p", _Config(size=9))
    assert item.config == _Config()


def test_conflict_message_is_short_and_names_fields() -> None:
    """The conflict error names the differing fields, not two reprs."""
    reg = _registry_of()
    reg.get("p", _Config(size=1, check="x" * 5000))
    with pytest.raises(ConfigError) as info:
        reg.get("p", _Config(size=2, check="x" * 5000))
    text = str(info.value)
    assert "size: 1 != 2" in text
    assert "check" not in text.split("(")[1].split(")", maxsplit=1)[0]
    assert len(text) < 400


def test_equal_lambdas_from_one_place_do_not_conflict() -> None:
    """Two configurations that differ only by lambda objects made by the
    same code with equal captured values are the same."""

    def make(limit: int) -> _Config:
        return _Config(check=lambda exc: limit > 0)

    reg = _registry_of()
    reg.get("p", make(1))
    reg.get("p", make(1))
    with pytest.raises(ConfigError, match="check"):
        reg.get("p", make(2))


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (1, 1, True),
        (1, 2, False),
        ((1, 2), (1, 2), True),
        ((1, 2), (1, 3), False),
        (_Config(), _Config(), True),
        (_Config(check=_Config()), _Config(check=_Config(size=2)), False),
        (len, len, True),
        (len, abs, False),
        ("1", 1, False),
    ],
)
def test_same_config_table(a: object, b: object, same: bool) -> None:
    """same_config compares values, nested attrs classes and callables."""
    assert same_config(a, b) is same
    assert (differences(a, b) == []) is same


def test_bound_methods_compare_by_self_and_function() -> None:
    """Bound methods are the same when bound to the same object."""
    one, two = _Item("a", _Config()), _Item("b", _Config())

    class Holder:
        def check(self) -> bool:
            return True

    h1, h2 = Holder(), Holder()
    assert same_config(_Config(check=h1.check), _Config(check=h1.check))
    assert not same_config(_Config(check=h1.check), _Config(check=h2.check))
    assert not same_config(one, two)


def test_odd_equality_counts_as_different() -> None:
    """A value whose == raises is treated as different, not a crash."""

    class Odd:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no")

        __hash__ = object.__hash__

    assert not same_config(_Config(check=Odd()), _Config(check=Odd()))


def test_empty_closure_cells_differ() -> None:
    """A closure over a not-yet-bound variable never matches."""

    def outer() -> Any:
        def inner() -> Any:
            return later  # noqa: F821 - deleted below on purpose

        f = inner
        later = 1
        del later
        return f

    assert not same_config(_Config(check=outer()), _Config(check=outer()))


def test_names_are_checked() -> None:
    """Names are non-blank strings, named in the error."""
    reg = _registry_of()
    with pytest.raises(ConfigTypeError, match=r"item\(name\)"):
        reg.get(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="empty"):
        reg.get("  ")
    with pytest.raises(ConfigError, match="empty"):
        reg.set_default(_Config(), " ")


def test_defaults_per_name_and_for_all() -> None:
    """A name's own default wins over the default for every name."""
    reg = _registry_of()
    reg.set_default(_Config(size=7))
    reg.set_default(_Config(size=9), "special")
    assert reg.get("any").config.size == 7
    assert reg.get("special").config.size == 9


def test_named_default_after_the_item_exists() -> None:
    """A named default for a live item is adopted while it is pristine,
    and refused (the call would do nothing) once it did work."""
    reg = _registry_of()
    item = reg.get("p")
    reg.set_default(_Config(size=2), "p")
    assert item.config.size == 2
    item.used = 1
    reg.set_default(_Config(size=2), "p")  # Same: fine.
    with pytest.raises(ConfigError, match="no effect"):
        reg.set_default(_Config(size=3), "p")


def test_named_default_makes_items_explicit() -> None:
    """An item made from a named default is not provisional."""
    reg = _registry_of()
    reg.set_default(_Config(size=2), "p")
    reg.get("p")
    with pytest.raises(ConfigError):
        reg.get("p", _Config(size=3))


def test_clear_resets_every_live_item_in_place() -> None:
    """A reset reaches items that holders keep: their state is fresh."""
    reg = _registry_of()
    held = reg.get("p", _Config(size=3))
    held.used = 5
    reg.clear()
    assert held.used == 0
    assert reg.peek("p") is None
    fresh = reg.get("p", _Config(size=4))
    assert fresh is not held
    assert fresh.config.size == 4


def test_reset_all_bumps_generation_and_clears_registered() -> None:
    """reset_all clears every registered registry and bumps generation."""
    reg = Registry(
        "test-kind",
        _Item,
        _Config,
        config_of=lambda i: i.config,
        reset=_reset,
    )
    try:
        assert _registry.REGISTRIES["test-kind"] is reg
        item = reg.get("x")
        item.used = 1
        before = _registry.generation()
        _registry.reset_all()
        assert _registry.generation() == before + 1
        assert item.used == 0
        assert len(reg) == 0
        with pytest.raises(ValueError, match="exists already"):
            Registry("test-kind", _Item, _Config, config_of=lambda i: i.config)
    finally:
        del _registry.REGISTRIES["test-kind"]


def test_repr_and_snapshots() -> None:
    """The repr counts items; names() and items() are snapshots."""
    reg = _registry_of()
    a = reg.get("a")
    assert reg.names() == ["a"]
    assert reg.items() == [a]
    assert repr(reg) == "<Registry 'item': 1 live, 1 kept, 0 pinned>"


def test_concurrent_lookups_make_one_instance() -> None:
    """32 threads asking for one new name get one object."""
    reg = _registry_of()
    barrier = threading.Barrier(32)
    got: list[_Item] = []

    def worker() -> None:
        barrier.wait()
        got.append(reg.get("shared"))

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(g) for g in got}) == 1


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf(
        "SC_PAGE_SIZE"
    )


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="Linux")
def test_a_million_names_stay_bounded() -> None:
    """1,000,000 distinct names: the process grows far less than 50 MB
    (resident memory, which also bounds the peak), and the registry keeps
    at most its limit."""
    reg = _registry_of(limit=1024)
    gc.collect()
    base = _rss()
    for i in range(1_000_000):
        reg.get(f"name-{i}")
    gc.collect()
    assert len(reg) == 1024
    assert _rss() - base < 50 * 2**20


def test_config_error_from_conflict_pickles() -> None:
    """The conflict error is an ordinary ConfigError with its field."""
    reg = _registry_of()
    reg.get("p", _Config(size=1))
    with pytest.raises(ConfigError) as info:
        reg.get("p", _Config(size=2))
    assert info.value.field == "item('p').config"
    assert isinstance(pickle.dumps(info.value.field), bytes)
