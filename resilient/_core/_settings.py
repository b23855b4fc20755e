"""
What the retry machine and the pipeline read from a policy.

`resilient.Policy` is the one implementation; the machine and the pipeline
are written against this protocol, so `_core` (and the layers under the
face) never import the policy module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol


if TYPE_CHECKING:
    from collections.abc import Callable

    from resilient._core._config_breaker import BreakerConfig
    from resilient._core._config_bulkhead import BulkheadConfig
    from resilient._core._config_retry_budget import RetryBudgetConfig
    from resilient.typing import (
        AsyncHook,
        Backoff,
        ExceptionPredicate,
        Hook,
        ResultPredicate,
        RetryAfter,
    )


class RetrySettings(Protocol):
    """The fields of a `resilient.Policy` the pipeline reads."""

    @property
    def name(self) -> str:
        """The dependency's name."""

    @property
    def attempts(self) -> int | None:
        """Total attempts; None for no limit but the budget."""

    @property
    def backoff(self) -> Backoff:
        """The wait before each retry."""

    @property
    def budget(self) -> float | None:
        """Seconds for the whole call, or None."""

    @property
    def timeout(self) -> float | None:
        """Seconds for one attempt, or None."""

    @property
    def retry_on(self) -> tuple[type[Exception], ...] | ExceptionPredicate:
        """Which exceptions are transient."""

    @property
    def retry_if_result(self) -> ResultPredicate | None:
        """Which results are retried."""

    @property
    def last_result(self) -> str:
        """``"return"`` or ``"raise"``: what a give-up on a result does."""

    @property
    def retry_after(self) -> RetryAfter | None:
        """Reads a server's wait hint from an exception."""

    @property
    def max_retry_after(self) -> float:
        """The largest server hint honoured, in seconds."""

    @property
    def before_sleep(self) -> Hook | AsyncHook | None:
        """Called before each wait."""

    @property
    def on_give_up(self) -> Hook | AsyncHook | None:
        """Called on giving up."""

    @property
    def breaker(self) -> BreakerConfig | None:
        """The breaker stage's configuration, or None."""

    @property
    def bulkhead(self) -> BulkheadConfig | None:
        """The bulkhead stage's configuration, or None."""

    @property
    def retry_budget(self) -> RetryBudgetConfig | None:
        """The retry budget's configuration, or None."""

    @property
    def fallback(self) -> Callable[[Exception], Any] | None:
        """The outermost stage: called with the call's final exception."""

    @property
    def fallback_on(self) -> tuple[type[Exception], ...] | ExceptionPredicate:
        """Which final exceptions the fallback takes over from."""

    @property
    def waits_for_breaker(self) -> bool:
        """Whether a call sits out an open breaker (`Policy`'s
        *wait_for_breaker*)."""

    @property
    def has_async_hooks(self) -> bool:
        """Whether a hook is async."""
