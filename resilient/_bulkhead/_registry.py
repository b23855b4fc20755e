"""
The process-wide bulkheads, one per name, in the core registry.
"""

from __future__ import annotations

from typing import Final, Unpack

from resilient._bulkhead._shells import Bulkhead
from resilient._core._config_bulkhead import BulkheadConfig, BulkheadKnobs
from resilient._core._registry import Registry
from resilient.exceptions import ConfigTypeError


def _check_config(config: object) -> BulkheadConfig | None:
    if config is not None and not isinstance(config, BulkheadConfig):
        raise ConfigTypeError(
            "bulkhead(config)", config, "must be a BulkheadConfig or None"
        )
    return config


def _adopt(bulkhead: Bulkhead, config: BulkheadConfig) -> bool:
    """A bulkhead made from the defaults takes the first explicit
    configuration, if it has seen no work."""
    m = bulkhead._machine  # noqa: SLF001
    with m._lock:  # noqa: SLF001
        if not m.is_idle():
            return False
        m.configure(config)
        return True


BULKHEADS: Final[Registry[Bulkhead, BulkheadConfig]] = Registry(
    "bulkhead",
    Bulkhead,
    BulkheadConfig,
    config_of=lambda b: b.config,
    adopt=_adopt,
    reset=lambda b: b._machine.reset(),  # noqa: SLF001
)


def bulkhead(
    name: str,
    /,
    config: BulkheadConfig | None = None,
    **knobs: Unpack[BulkheadKnobs],
) -> Bulkhead:
    """
    The process-wide bulkhead called *name*, configured by *config* or by
    the keywords of `BulkheadConfig`::

        db = resilient.bulkhead("db", max_concurrent=10, max_wait=0.5)

    Made on first use; later calls get the same object, for as long as
    anything holds it (a decorated function, a held permit, a variable).
    A lookup without a configuration (``bulkhead("db").statistics()``)
    does not fix the configuration: the first explicit one is taken, as
    long as the bulkhead has not been used.

    Raises:
        TypeError: Both *config* and keywords are given.
        ConfigError: A bad value, or a configuration that differs from the
            existing bulkhead's (the message names the fields).

    .. versionadded:: 26.11.0
    """
    if knobs:
        if config is not None:
            raise TypeError("bulkhead() takes a config or keywords, not both")
        config = BulkheadConfig(**knobs)
    return BULKHEADS.get(name, _check_config(config))


def get_bulkhead(name: str, config: BulkheadConfig | None = None) -> Bulkhead:
    """
    `bulkhead` without keywords, under the name the pipeline uses.

    .. versionadded:: 26.11.0
    """
    return BULKHEADS.get(name, _check_config(config))
