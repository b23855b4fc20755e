"""
The one registry of named stateful parts: breakers, bulkheads, retry
budgets, and whatever else is shared process-wide by name.

Every kind gets its own `Registry`, and every registry follows the same
rules:

- **One live instance per name, whatever happens.** Items are found through
  a weak map first, so an item that anything still holds (a decorated
  function, a user's variable) is the one every later lookup returns, even
  after the registry stopped keeping it.
- **Bounded and O(1).** The registry itself keeps the *limit* most recently
  looked-up items alive (an LRU of strong references); a new name costs a
  dict insert and, past the limit, one pop, at any size.
- **Busy items are never dropped.** `pin` keeps an item alive while it is
  busy (an open breaker, a held lock), `unpin` lets it go.
- **Looking never blocks configuring.** An item made without a
  configuration (``breaker("p").state``) is provisional: the first explicit
  configuration for that name is adopted, if the kind allows it and the item
  has seen no work; otherwise a conflict error names the fields that differ.
- **A reset reaches every holder.** `reset_all` resets every live item in
  place, forgets them all, and bumps a global `generation`; holders that
  cache items (the pipeline's guards) compare the generation and look up
  again.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final

import attrs

from resilient._core._validate import check_name
from resilient.exceptions import ConfigError


if TYPE_CHECKING:
    from collections.abc import Callable


T = TypeVar("T")
C = TypeVar("C")

DEFAULT_LIMIT: Final = 1024
"""How many items a registry keeps alive on its own, per kind."""

_REPR_LIMIT: Final = 60

_generation = 0


def generation() -> int:
    """
    A number that changes whenever the registries are reset: a holder that
    cached items compares it with the one it saw and looks up again.
    """
    return _generation


REGISTRIES: Final[dict[str, Registry[Any, Any]]] = {}
"""Every registry by kind; `reset_all` and diagnostics iterate it."""


@final
class Registry(Generic[T, C]):
    """
    Items of one kind by name.

    Args:
        kind: What it holds, as users call the lookup (``"breaker"``): used
            in error messages and as the key in `REGISTRIES`.
        make: Builds an item from a name and a configuration. Called with
            the registry's lock held: it must not look up other items.
        default: The configuration used when none is given or registered.
        config_of: The configuration an item was made with.
        adopt: Reconfigures a provisional item in place with an explicit
            configuration; returns False when it can no longer (it has seen
            work). None: provisional items never adopt.
        reset: Puts an item back into its initial state (for `reset_all`).
        limit: How many items to keep alive on the registry's own account.
        register: Whether to enter the registry into `REGISTRIES`.
    """

    __slots__ = (
        "__weakref__",
        "_adopt",
        "_config_of",
        "_default",
        "_defaults",
        "_live",
        "_lock",
        "_make",
        "_pinned",
        "_provisional",
        "_recent",
        "_reset",
        "kind",
        "limit",
    )

    def __init__(
        self,
        kind: str,
        make: Callable[[str, C], T],
        default: Callable[[], C],
        *,
        config_of: Callable[[T], C],
        adopt: Callable[[T, C], bool] | None = None,
        reset: Callable[[T], None] | None = None,
        limit: int = DEFAULT_LIMIT,
        register: bool = True,
    ) -> None:
        self.kind = kind
        self.limit = limit
        self._make = make
        self._default = default
        self._config_of = config_of
        self._adopt = adopt
        self._reset = reset
        self._lock = threading.Lock()
        self._live: weakref.WeakValueDictionary[str, T] = (
            weakref.WeakValueDictionary()
        )
        self._recent: collections.OrderedDict[str, T] = (
            collections.OrderedDict()
        )
        self._pinned: dict[str, T] = {}
        self._provisional: weakref.WeakSet[Any] = weakref.WeakSet()
        self._defaults: dict[str | None, C] = {}
        if register:
            if kind in REGISTRIES:
                raise ValueError(f"a registry of {kind!r} exists already")
            REGISTRIES[kind] = self

    def __repr__(self) -> str:
        return (
            f"<Registry {self.kind!r}: {len(self._live)} live, "
            f"{len(self._recent)} kept, {len(self._pinned)} pinned>"
        )

    def get(self, name: str, config: C | None = None) -> T:
        """
        The item called *name*, made on first use with *config*, or the
        default registered for *name*, or for every name, or the kind's
        default.

        Raises:
            ConfigTypeError: *name* is not a str.
            ConfigError: *name* is blank, or *config* differs from the
                configuration of the live item and it cannot adopt it.
        """
        check_name(f"{self.kind}(name)", name)
        with self._lock:
            item = self._live.get(name)
            if item is None:
                item = self._new(name, config)
            elif config is not None:
                self._reconcile(name, item, config)
            recent = self._recent
            recent[name] = item
            recent.move_to_end(name)
            if len(recent) > self.limit:
                recent.popitem(last=False)
            return item

    def _new(self, name: str, config: C | None) -> T:
        provisional = False
        if config is None:
            config = self._defaults.get(name)
            if config is None:
                provisional = True
                config = self._defaults.get(None)
                if config is None:
                    config = self._default()
        item = self._make(name, config)
        self._live[name] = item
        if provisional:
            self._provisional.add(item)
        return item

    def _reconcile(self, name: str, item: T, config: C) -> None:
        """An explicit *config* for a live *item*: same, adopt, or fail."""
        current = self._config_of(item)
        if same_config(config, current):
            self._provisional.discard(item)
            return
        adopt = self._adopt
        if (
            item in self._provisional
            and adopt is not None
            and adopt(item, config)
        ):
            self._provisional.discard(item)
            return
        raise conflict(f"{self.kind}({name!r}).config", config, current)

    def peek(self, name: str) -> T | None:
        """The live item called *name*, or None; never makes one."""
        return self._live.get(name)

    def pin(self, name: str, item: T) -> None:
        """Keep *item* alive while it is busy (if it is the live one)."""
        with self._lock:
            if self._live.get(name) is item:
                self._pinned[name] = item

    def unpin(self, name: str, item: T) -> None:
        """*item* is idle again: the registry need not keep it."""
        with self._lock:
            if self._pinned.get(name) is item:
                del self._pinned[name]

    def set_default(self, config: C, name: str | None = None) -> None:
        """
        Register the configuration items get when made without one: for
        *name* only, or for every name without a default of its own.

        Raises:
            ConfigError: *name* already has a live item with another
                configuration that it cannot adopt: the call would have no
                effect.
        """
        if name is not None:
            check_name(f"set_{self.kind}_defaults(name)", name)
        with self._lock:
            if name is not None:
                item = self._live.get(name)
                if item is not None:
                    self._reconcile_default(name, item, config)
            self._defaults[name] = config

    def _reconcile_default(self, name: str, item: T, config: C) -> None:
        current = self._config_of(item)
        if same_config(config, current):
            return
        adopt = self._adopt
        if (
            item in self._provisional
            and adopt is not None
            and adopt(item, config)
        ):
            self._provisional.discard(item)
            return
        raise conflict(
            f"set_{self.kind}_defaults(name={name!r})",
            config,
            current,
            why=f"would have no effect: {self.kind} {name!r} exists already",
        )

    def clear(self) -> None:
        """Reset every live item in place and forget them all (tests)."""
        with self._lock:
            items = list(self._live.values())
            self._live.clear()
            self._recent.clear()
            self._pinned.clear()
            self._provisional.clear()
            self._defaults.clear()
        reset = self._reset
        if reset is not None:
            for item in items:
                reset(item)

    def names(self) -> list[str]:
        """The names of the live items (a snapshot)."""
        with self._lock:
            return list(self._live.keys())

    def items(self) -> list[T]:
        """The live items (a snapshot)."""
        with self._lock:
            return list(self._live.values())

    def kept(self) -> list[str]:
        """The names the registry keeps alive itself, least recent first."""
        with self._lock:
            return [*self._recent, *self._pinned]

    def __len__(self) -> int:
        return len(self._live)


def reset_all() -> None:
    """Reset and forget every item of every registry; bump `generation`."""
    global _generation  # noqa: PLW0603 - the one process-wide counter
    _generation += 1
    for registry in list(REGISTRIES.values()):
        registry.clear()


# Comparing configurations.


def same_config(a: object, b: object) -> bool:
    """
    Whether two configurations mean the same: identity first (a policy asks
    with the very object the registry holds), then equality, then field by
    field, with functions compared by what they are rather than which
    object they are (two lambdas from the same line with equal closures are
    the same).
    """
    if a is b:
        return True
    with contextlib.suppress(Exception):  # An odd __eq__: compare fields.
        if a == b:
            return True
    return not differences(a, b)


def differences(a: object, b: object) -> list[str]:
    """
    The fields in which *a* and *b* differ, as ``"field: x != y"`` lines;
    empty when they are the same.
    """
    if type(a) is not type(b) or not attrs.has(type(a)):
        return [] if _same_value(a, b) else [f"{_short(a)} != {_short(b)}"]
    out = []
    for field in attrs.fields(type(a)):  # type: ignore[arg-type]
        x, y = getattr(a, field.name), getattr(b, field.name)
        if not _same_value(x, y):
            out.append(f"{field.name}: {_short(x)} != {_short(y)}")
    return out


def _same_value(x: object, y: object) -> bool:
    if x is y:
        return True
    if attrs.has(type(x)) and type(x) is type(y):
        return not differences(x, y)
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(map(_same_value, x, y))
    if callable(x) and callable(y):
        return _same_callable(x, y)
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - an odd __eq__ means "differs"
        return False


def _same_callable(f: object, g: object) -> bool:
    """Functions made by the same code with the same captured values."""
    if f == g:
        return True
    if type(f) is not type(g):
        return False
    func_f, func_g = getattr(f, "__func__", None), getattr(g, "__func__", None)
    if func_f is not None and func_g is not None:  # bound methods
        return getattr(f, "__self__", None) is getattr(
            g, "__self__", None
        ) and _same_callable(func_f, func_g)
    code_f, code_g = getattr(f, "__code__", None), getattr(g, "__code__", None)
    if code_f is None or code_f != code_g:
        return False
    cells_f = getattr(f, "__closure__", None) or ()
    cells_g = getattr(g, "__closure__", None) or ()
    try:
        captured = [c.cell_contents for c in cells_f] == [
            c.cell_contents for c in cells_g
        ]
    except ValueError:  # an empty cell
        return False
    return (
        captured
        and getattr(f, "__defaults__", None)
        == getattr(g, "__defaults__", None)
        and getattr(f, "__kwdefaults__", None)
        == getattr(g, "__kwdefaults__", None)
    )


def _short(value: object) -> str:
    text = repr(value)
    if len(text) > _REPR_LIMIT:
        text = text[: _REPR_LIMIT - 3] + "..."
    return text


def conflict(
    where: str,
    asked: object,
    current: object,
    *,
    why: str = "one name, one configuration",
) -> ConfigError:
    """
    The error for a configuration that differs from an existing one: it
    names the fields that differ (short reprs), not two whole objects.
    """
    diff = differences(current, asked)
    detail = "; ".join(diff) if diff else f"{_short(current)} != asked"
    error = ConfigError(where, asked, why)
    # The message names what differs and shows the asked value briefly:
    # two whole configurations can run to hundreds of characters each.
    message = (
        f"{where} differs from the configuration in use ({detail}); "
        f"{why}; got {_short(asked)}"
    )
    error.args = (message,)
    return error
