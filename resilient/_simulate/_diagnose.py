"""
What a run's figures say to change in the policy.

`diagnose` reads a `SimulationResult` and returns short lines, each made
from the run's own figures with a threshold written here:

- the calls that gave up before the dependency came back (raise the
  attempts or the budget);
- the calls that gave up outwaiting the breaker, or a breaker still open
  at the end (shorten its open interval);
- the load after the outage above the capacity (jitter, a retry budget, a
  breaker);
- the calls the retry budget failed fast (to raise its knobs only when
  the load stayed within the capacity: one decision per knob);

or that there is nothing to change. `differences` says where the policy
differs from the library's own defaults (``Policy()``, ``BreakerConfig()``,
``RetryBudgetConfig()``), since a run's figures hold for its settings only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from resilient import (
    BreakerConfig,
    BreakerState,
    Policy,
    RetryBudgetConfig,
    TimeWindow,
)
from resilient._simulate._config import strategy_of


if TYPE_CHECKING:
    from resilient._simulate._result import SimulationResult


EARLY_GIVE_UPS: Final = 0.05
"""Say so when more than this share of the calls gave up (attempts or
budget) before the outage ended."""

BREAKER_GIVE_UPS: Final = 0.05
"""Say so when more than this share of the calls gave up outwaiting the
breaker."""

OVERLOAD: Final = 1.0
"""Say so when the busiest bucket after the outage reached this multiple
of the capacity (part of it was refused)."""

BUDGET_GIVE_UPS: Final = 0.05
"""Say so when more than this share of the calls gave up because the retry
budget refused their retry."""

HEALTHY: Final = 0.99
"""Nothing to change when at least this share succeeded and nothing above
was said."""

_JITTERED: Final = frozenset({"full", "equal", "decorrelated"})


def _share(n: int, of: int) -> str:
    return f"{n} of {of} calls ({n / of:.0%})"


def diagnose(result: SimulationResult) -> tuple[str, ...]:
    """
    What *result*'s figures say to change, one line each; a single line
    saying so when there is nothing to change.
    """
    overload = _overload(result)
    lines = [
        *_early(result),
        *_breaker(result),
        *overload,
        # One decision per knob: when the load overran the capacity, the
        # overload line says to lower the ratio, and the budget's line must
        # not say to raise it.
        *_budget(result, overloaded=bool(overload)),
    ]
    s = result.summary
    if not lines and s.success_rate >= HEALTHY:
        lines.append(
            f"nothing to change: {s.success_rate:.1%} of the calls "
            "succeeded and the load after the outage stayed within the "
            "capacity"
        )
    return tuple(lines)


def _early(result: SimulationResult) -> list[str]:
    """The calls that ran out of attempts or budget during the outage."""
    c = result.config
    p = c.policy
    calls = result.calls
    early: dict[str, int] = {}
    reasons = calls.reasons
    if reasons.count("attempts") + reasons.count(
        "budget"
    ) <= EARLY_GIVE_UPS * len(calls):
        return []  # Too few such give-ups at all, let alone early ones.
    # The columns, not a `CallOutcome` per call: a run may have millions.
    for end, reason in zip(calls.ends, reasons, strict=True):
        if reason in {"attempts", "budget"} and (
            end is not None and end < c.outage
        ):
            early[reason] = early.get(reason, 0) + 1
    n = sum(early.values())
    if n <= EARLY_GIVE_UPS * len(calls):
        return []
    who = "every call" if n == len(calls) else _share(n, len(calls))
    raise_ = []
    if early.get("attempts"):
        raise_.append(f"--attempts (now {p.attempts})")
    if early.get("budget"):
        raise_.append(f"--budget (now {p.budget:g} s)")
    return [
        (
            f"{who} gave up before the dependency came back at "
            f"{c.outage:g} s: raise {' or '.join(raise_)} so that the "
            "retries outlast the outage"
        )
    ]


def _breaker(result: SimulationResult) -> list[str]:
    """Calls lost outwaiting the breaker, and a breaker open at the end."""
    b = result.config.policy.breaker
    if b is None:
        return []
    lines = []
    calls = len(result.calls)
    waited = result.calls.reasons.count("breaker_open")
    if waited > BREAKER_GIVE_UPS * calls:
        lines.append(
            f"{_share(waited, calls)} gave up waiting for the breaker to "
            f"admit them: shorten --breaker-open-interval (now "
            f"{b.open_interval:g} s) or raise --budget"
        )
    last = result.transitions[-1].new if result.transitions else None
    if last is not None and last is not BreakerState.CLOSED:
        lines.append(
            f"the breaker was still {last.value.replace('_', '-')} at the "
            f"end of the run ({result.end:.2f} s): shorten "
            f"--breaker-open-interval (now {b.open_interval:g} s)"
        )
    return lines


def _overload(result: SimulationResult) -> list[str]:
    """A load after the outage above the capacity, and what cuts it."""
    c = result.config
    after = result.summary.peak_after_outage
    if after is None:
        return []
    n, at = after
    times = n / (c.capacity * c.bucket)
    if times < OVERLOAD:
        return []
    p = c.policy
    fixes = []
    if strategy_of(p.backoff) not in _JITTERED:
        fixes.append("spread the retries with jitter (--strategy full)")
    if p.retry_budget is None:
        fixes.append("cap them with a retry budget (--retry-budget)")
    if p.breaker is None:
        fixes.append("stop them while it fails with a breaker (--breaker)")
    if not fixes:
        fixes.append(
            "lower --retry-budget-ratio, or give the dependency more capacity"
        )
    return [
        f"the load after the outage reached {times:.1f}x the capacity "
        f"(at {at:g} s), and what it could not serve failed: "
        + "; or ".join(fixes)
    ]


def _budget(result: SimulationResult, *, overloaded: bool) -> list[str]:
    """
    The calls the retry budget failed fast; to raise its knobs only if the
    dependency was not overloaded after the outage (*overloaded*).
    """
    r = result.config.policy.retry_budget
    if r is None:
        return []
    calls = len(result.calls)
    refused = result.calls.reasons.count("retry_budget")
    if refused <= BUDGET_GIVE_UPS * calls:
        return []
    if overloaded:
        return [
            (
                f"the retry budget failed {_share(refused, calls)} fast, "
                "shedding load the dependency could not take: it was "
                "overloaded even so (above)"
            )
        ]
    return [
        (
            f"the retry budget failed {_share(refused, calls)} fast, to shed "
            f"load: raise --retry-budget-ratio (now {r.ratio:g}) or "
            f"--retry-budget-min (now {r.min_per_second:g}/s) if the "
            "dependency can take more"
        )
    ]


def differences(policy: Policy) -> tuple[str, ...]:
    """
    Where *policy* differs from the library's defaults, as ``what (the
    library's value)``; empty when it differs in nothing the options set.
    """
    d = Policy()
    out = []
    if policy.attempts != d.attempts:
        mine = (
            "no attempt limit"
            if policy.attempts is None
            else f"{policy.attempts} attempts"
        )
        out.append(f"{mine} (library: {d.attempts})")
    if policy.budget != d.budget:
        mine = (
            "no budget"
            if policy.budget is None
            else f"a {policy.budget:g} s budget"
        )
        out.append(f"{mine} (library: {d.budget:g} s)")
    if policy.backoff != d.backoff:
        out.append(f"{policy.backoff!r} (library: {d.backoff!r})")
    return (
        *out,
        *_breaker_differences(policy.breaker),
        *_budget_differences(policy.retry_budget),
    )


def _breaker_differences(b: BreakerConfig | None) -> list[str]:
    out: list[str] = []
    db = BreakerConfig()
    if b is not None:
        if isinstance(b.window, TimeWindow) and b.window != db.window:
            out.append(
                f"breaker window {b.window.seconds:g} s "
                f"(library: {db.window.seconds:g} s)"  # type: ignore[union-attr]
            )
        for field, unit in (
            ("failure_rate", ""),
            ("minimum_calls", ""),
            ("open_interval", " s"),
            ("half_open_probes", ""),
        ):
            mine, theirs = getattr(b, field), getattr(db, field)
            if mine != theirs:
                name = field.replace("_", " ")
                out.append(
                    f"breaker {name} {mine:g}{unit} "
                    f"(library: {theirs:g}{unit})"
                )
    return out


def _budget_differences(r: RetryBudgetConfig | None) -> list[str]:
    out: list[str] = []
    dr = RetryBudgetConfig()
    if r is not None:
        for field, unit in (
            ("ratio", ""),
            ("min_per_second", "/s"),
            ("window", " s"),
        ):
            mine, theirs = getattr(r, field), getattr(dr, field)
            if mine != theirs:
                name = field.replace("_", " ")
                out.append(
                    f"retry budget {name} {mine:g}{unit} "
                    f"(library: {theirs:g}{unit})"
                )
    return out
