"""
The simulator's text: the header, the load chart and the figures that
``python -m resilient simulate`` prints.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Final

from resilient import TimeWindow
from resilient._simulate._config import strategy_of
from resilient._simulate._diagnose import diagnose, differences


if TYPE_CHECKING:
    from resilient import Policy
    from resilient._simulate._config import SimulationConfig
    from resilient._simulate._result import SimulationResult


def _describe_policy(policy: Policy) -> str:
    attempts = (
        "no attempt limit"
        if policy.attempts is None
        else f"{policy.attempts} attempts"
    )
    budget = (
        "no budget" if policy.budget is None else f"{policy.budget:g} s budget"
    )
    return f"{policy.backoff!r}, {attempts}, {budget}"


def _describe_guards(policy: Policy) -> str:
    """The breaker and the retry budget, in a few words; '' for neither."""
    parts: list[str] = []
    b = policy.breaker
    if b is not None:
        window = (
            f"{b.window.seconds:g} s"
            if isinstance(b.window, TimeWindow)
            else f"{b.window.size} calls"
        )
        parts.append(
            f"breaker (opens at {b.failure_rate:.0%} of >= "
            f"{b.minimum_calls} calls in {window}, open "
            f"{b.open_interval:g} s, {b.half_open_probes} probes)"
        )
    r = policy.retry_budget
    if r is not None:
        parts.append(
            f"retry budget ({r.ratio:g} per call + {r.min_per_second:g}/s "
            f"over {r.window:g} s)"
        )
    return ", ".join(parts)


def short_label(config: SimulationConfig) -> str:
    """A short name for *config*'s guards: plain, + breaker, + budget..."""
    p = config.policy
    parts = [strategy_of(p.backoff) or type(p.backoff).__name__]
    if p.retry_budget is not None:
        parts.append("retry budget")
    if p.breaker is not None:
        parts.append("breaker")
    return " + ".join(parts)


def render_header(result: SimulationResult) -> str:
    """One line saying what was simulated."""
    c = result.config
    traffic = (
        f" + {c.rate:g} calls/s until {c.rate_until:g} s" if c.rate else ""
    )
    guards = _describe_guards(c.policy)
    return (
        f"{c.clients} clients{traffic}, {c.outage:g} s outage, capacity "
        f"{c.capacity:g}/s (burst {c.tokens:g}), {_describe_policy(c.policy)}"
        f"{', ' + guards if guards else ''}, seed {c.seed}"
    )


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def render_summary(result: SimulationResult) -> str:
    """
    The figures: success rate, give-ups, amplification, peak load, latency
    percentiles, drain and recovery times. The notebooks print this too.
    """
    s = result.summary
    c = result.config
    per_bucket = c.capacity * c.bucket
    rows: list[tuple[str, str]] = [
        ("calls", f"{s.calls}"),
        ("succeeded", f"{s.succeeded} ({s.success_rate:.1%})"),
    ]
    reasons = ", ".join(f"{r.replace('_', ' ')} {n}" for r, n in s.give_ups)
    gave_up = s.calls - s.succeeded
    rows.append(("gave up", f"{gave_up} ({reasons})" if reasons else "0"))
    rows.append(
        ("attempts", f"{s.attempts} (amplification {s.amplification:.2f}x)")
    )
    if c.policy.breaker is not None or s.refused:
        rows.append(("breaker rejected", f"{s.refused} attempts (not sent)"))
    if s.budget_retries is not None:
        rows.append(
            (
                "retry budget",
                (
                    f"allowed {s.budget_retries} retries, "
                    f"refused {s.budget_refused}"
                ),
            )
        )
    n, at = s.peak
    rows.append(("peak load", f"{n} per {c.bucket:g} s at {at:g} s"))
    if s.peak_after_outage is not None:
        n, at = s.peak_after_outage
        rows.append(
            (
                "peak after outage",
                (
                    f"{n} per {c.bucket:g} s at {at:g} s "
                    f"({n / per_bucket:.1f}x capacity)"
                ),
            )
        )
    rows.append(
        (
            "during outage",
            (
                f"{s.during_outage} requests "
                f"({s.during_outage / c.outage if c.outage else 0:.1f}/s)"
            ),
        )
    )
    if s.latency is None:
        rows.append(("latency (ok)", "none succeeded"))
    else:
        p50, p90, p99, top = s.latency
        rows.append(
            (
                "latency (ok)",
                f"p50 {_s(p50)}, p90 {_s(p90)}, p99 {_s(p99)}, max {_s(top)}",
            )
        )
    rows.append(
        (
            "drain",
            (
                f"{_s(s.drain)} after the outage "
                f"(last attempt at {_s(s.last_attempt)})"
            ),
        )
    )
    rows.append(
        (
            "overload ended",
            f"{_s(s.recovery)} after the outage"
            if result.overload_end is not None
            else "never overloaded",
        )
    )
    states = result.breaker_states
    if states is not None:
        rows += _breaker_rows(result, states)
    return "\n".join(f"{k:<18} {v}" for k, v in rows)


def _breaker_rows(
    result: SimulationResult, states: str
) -> list[tuple[str, str]]:
    s = result.summary
    c = result.config
    opened = s.breaker_opened or 0
    if s.breaker_closed is not None:
        closed = (
            f"closed at {_s(s.breaker_closed)} "
            f"({_s(s.breaker_closed - c.outage)} after the outage)"
        )
    elif opened:
        closed = "still open at the end"
    else:
        closed = "never opened"
    times = "time" if opened == 1 else "times"
    rows = [("breaker", f"opened {opened} {times}, {closed}")]
    # The states, ten buckets to a group and six groups to a line.
    groups = [states[i : i + 10] for i in range(0, len(states), 10)]
    lines = [" ".join(groups[i : i + 6]) for i in range(0, len(groups), 6)]
    lines = lines or [""]
    rows.append(
        (
            "breaker states",
            f"per {c.bucket:g} s: C closed, O open, H half-open",
        )
    )
    rows += [("", line) for line in lines]
    return rows


_UNICODE: Final = ("\u2588", "\u2591", "\u2502", "\u00bb")
_ASCII: Final = ("#", "x", "|", ">")


def render_chart(
    result: SimulationResult, *, width: int = 50, ascii_only: bool = False
) -> str:
    """
    The load on the dependency over time as a text chart.

    One row per bucket: a bar of the requests that arrived in it (served
    then failed), a mark at the dependency's capacity, the count, and
    ``outage`` on the buckets during the outage.
    The scale fits the busiest bucket after the outage (or a quarter more
    than the capacity, if larger): that is where policies differ.
    Longer bars, as during the outage, are cut and end in ``\u00bb``
    (``>`` in ASCII).

    Args:
        result: What to chart.
        width: Characters for the longest bar.
        ascii_only: Draw with ``#``, ``x``, ``|`` and ``>`` only.
    """
    c = result.config
    ok_char, fail_char, cap_char, cut_char = _ASCII if ascii_only else _UNICODE
    per_bucket = c.capacity * c.bucket
    after = result.summary.peak_after_outage
    busiest = after[0] if after is not None else result.summary.peak[0]
    # The capacity sits at four fifths of the width when nothing is busier
    # after the outage, so that overloads show past it.
    scale = width / max(busiest, per_bucket * 1.25)
    cap_col = round(per_bucket * scale)
    decimals = _decimals(c.bucket)
    label = max(len(f"{t:.{decimals}f}") for t in (0.0, result.end))
    digits = len(str(max(result.load, default=0)))
    title = (
        f"Load on the dependency: requests per {c.bucket:g} s "
        f"({ok_char} served, {fail_char} failed, {cap_char} capacity "
        f"{per_bucket:g})"
    )
    lines = [title]
    states = result.breaker_states
    if states is not None:
        lines[0] += "; breaker: C closed, O open, H half-open"
    for i, (n, ok) in enumerate(zip(result.load, result.served, strict=True)):
        t = i * c.bucket
        good = round(ok * scale)
        bad = round(n * scale) - good
        if n and not good + bad:
            # Never hide a bucket that had requests: one cell of the kind
            # that made most of them.
            good, bad = (1, 0) if 2 * ok >= n else (0, 1)
        cells = [ok_char] * good + [fail_char] * bad
        if len(cells) > width:
            cells[width - 1 :] = [cut_char]
        cells += [" "] * (width - len(cells))
        # The capacity mark takes a column of its own, so a bar that
        # passes it shows beyond it.
        cells.insert(cap_col, cap_char)
        note = "  outage" if t < c.outage else ""
        state = "" if states is None else states[i] + " "
        lines.append(
            f"{t:>{label}.{decimals}f} s {state}{''.join(cells)} "
            f"{n:>{digits}}{note}".rstrip()
        )
    return "\n".join(lines)


def _decimals(seconds: float) -> int:
    text = f"{seconds:g}"
    return 0 if "." not in text else min(3, len(text.split(".")[1]))


def render_text(result: SimulationResult, *, ascii_only: bool = False) -> str:
    """
    What ``python -m resilient simulate`` prints: header, chart, figures,
    and what the figures say to change.
    """
    return "\n\n".join(
        (
            render_header(result),
            render_chart(result, ascii_only=ascii_only),
            render_summary(result),
            render_diagnosis(result),
        )
    )


def render_diagnosis(result: SimulationResult) -> str:
    """
    What the figures say to change (`diagnose`), and where the run's policy
    differs from the library's defaults, in the figures' two columns.
    """
    findings = diagnose(result)
    # One finding per item, marked when there are several.
    mark = "- " if len(findings) > 1 else ""
    rows = [
        ("" if i else "what to change", mark, line)
        for i, line in enumerate(findings)
    ]
    changed = differences(result.config.policy)
    if changed:
        rows.append(
            (
                "not the defaults",
                "",
                "this run's policy differs from the library's: "
                + "; ".join(changed),
            )
        )
    lines: list[str] = []
    for key, bullet, text in rows:
        wrapped = textwrap.wrap(
            text,
            width=_WIDTH - _KEY - 1 - len(bullet),
            break_on_hyphens=False,
        )
        lines.append(f"{key:<{_KEY}} {bullet}{wrapped[0]}")
        indent = " " * (_KEY + 1 + len(bullet))
        lines += [indent + more for more in wrapped[1:]]
    return "\n".join(lines)


_KEY: Final = 18
_WIDTH: Final = 79
