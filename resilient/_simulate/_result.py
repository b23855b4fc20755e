"""
What a simulation measured: every call's outcome, the load per bucket, the
breaker's transitions, and the `Summary` of the figures a user tuning a
policy wants.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, final, overload

import attrs

from resilient import BreakerState, BreakerTransition


if TYPE_CHECKING:
    from collections.abc import Iterator

    from resilient import RetryBudget
    from resilient._breaker import _BreakerMachine
    from resilient._simulate._config import SimulationConfig


@final
@attrs.frozen
class CallOutcome:
    """
    How one client's call ended.

    Attributes:
        client: The client's number, from 0.
        start: When the call started, in seconds.
        end: When it ended (success or give-up); None if it was still going
            when the run stopped.
        attempts: Attempts made, the first one included.
        ok: Whether it succeeded.
        reason: Why it gave up (a `GiveUpReason`, or ``"unfinished"``);
            None on success.
    """

    client: int
    start: float
    end: float | None
    attempts: int
    ok: bool
    reason: str | None

    @property
    def latency(self) -> float | None:
        """Seconds from start to end; None if unfinished."""
        return None if self.end is None else self.end - self.start


@final
class Calls(Sequence[CallOutcome]):
    """
    The outcome of each call, by call number: a read-only sequence of
    `CallOutcome`, kept as four columns (a million calls are four lists,
    not a million objects) and made into a `CallOutcome` when one is read.

    Equal to another `Calls` with the same columns, and to any sequence of
    the same outcomes (a tuple of `CallOutcome` included).

    Attributes:
        starts: When each call started, in seconds.
        ends: When each ended; None if it was still going at the end.
        attempts: The attempts each made, the first one included.
        reasons: Why each gave up (``"unfinished"`` if still going); None
            for a call that succeeded.

    .. versionadded:: 26.12.0
       `SimulationResult.calls` was a tuple of `CallOutcome`.
    """

    __slots__ = ("attempts", "ends", "reasons", "starts")

    def __init__(
        self,
        starts: Sequence[float],
        ends: Sequence[float | None],
        attempts: Sequence[int],
        reasons: Sequence[str | None],
    ) -> None:
        self.starts: tuple[float, ...] = tuple(starts)
        self.ends: tuple[float | None, ...] = tuple(ends)
        self.attempts: tuple[int, ...] = tuple(attempts)
        self.reasons: tuple[str | None, ...] = tuple(reasons)
        if not (
            len(self.starts)
            == len(self.ends)
            == len(self.attempts)
            == len(self.reasons)
        ):
            raise ValueError("Calls: the columns differ in length")

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> CallOutcome: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[CallOutcome, ...]: ...

    def __getitem__(
        self, index: int | slice
    ) -> CallOutcome | tuple[CallOutcome, ...]:
        if isinstance(index, slice):
            return tuple(self._outcome(i) for i in range(len(self))[index])
        return self._outcome(range(len(self))[index])

    def _outcome(self, number: int) -> CallOutcome:
        reason = self.reasons[number]
        return CallOutcome(
            number,
            self.starts[number],
            self.ends[number],
            self.attempts[number],
            ok=reason is None,
            reason=reason,
        )

    def __iter__(self) -> Iterator[CallOutcome]:
        for number, start, end, attempts, reason in zip(
            range(len(self)),
            self.starts,
            self.ends,
            self.attempts,
            self.reasons,
            strict=True,
        ):
            yield CallOutcome(
                number, start, end, attempts, ok=reason is None, reason=reason
            )

    def _columns(self) -> tuple[tuple[object, ...], ...]:
        return (self.starts, self.ends, self.attempts, self.reasons)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Calls):
            return self._columns() == other._columns()
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._columns())

    def __repr__(self) -> str:
        return f"<Calls: {len(self)} calls>"


@final
@attrs.frozen(kw_only=True)
class Summary:
    """
    The figures ``python -m resilient simulate`` prints.

    Attributes:
        calls: Calls made (one per client).
        succeeded: Calls that succeeded.
        success_rate: *succeeded* / *calls*.
        give_ups: ``(reason, count)`` pairs, most frequent first; a call
            still going when the run stopped counts as ``"unfinished"``.
        attempts: Requests that reached the dependency.
        refused: Attempts the circuit breaker rejected: they were never
            sent. (A retry the retry budget refuses is not an attempt: the
            call gives up for ``retry_budget``.)
        amplification: *attempts* / *calls*: how much work the retries
            multiplied the traffic by.
        peak: The most requests in one bucket, and when that bucket starts.
        peak_after_outage: The same, over the buckets that start once the
            outage is over (None if there are none).
        during_outage: Requests that reached the dependency during the
            outage.
        latency: p50, p90, p99 and max of the successful calls' latency,
            in seconds (None if none succeeded).
        last_attempt: When the last request reached the dependency.
        drain: Seconds from the end of the outage to the last request, or
            0.0 if every call had ended by then.
        recovery: Seconds from the end of the outage to the last request
            refused for overload (0.0 if none was): after it, the
            dependency served everything it was sent.
        breaker_opened: How often the breaker opened (None without one).
        breaker_closed: When the breaker closed for the last time, if it
            had opened and ended the run closed; else None.
        budget_retries: Retries the retry budget allowed (None without
            one).
        budget_refused: Retries it refused (None without one).
        budget_calls: Calls the retry budget counted, one per call (None
            without one).
    """

    calls: int
    succeeded: int
    success_rate: float
    give_ups: tuple[tuple[str, int], ...]
    attempts: int
    refused: int
    amplification: float
    peak: tuple[int, float]
    peak_after_outage: tuple[int, float] | None
    during_outage: int
    latency: tuple[float, float, float, float] | None
    last_attempt: float
    drain: float
    recovery: float
    breaker_opened: int | None = None
    breaker_closed: float | None = None
    budget_retries: int | None = None
    budget_refused: int | None = None
    budget_calls: int | None = None


@final
@attrs.frozen(kw_only=True)
class SimulationResult:
    """
    What a simulation measured.

    Attributes:
        config: The simulation's configuration.
        load: Requests that reached the dependency, per bucket of
            ``config.bucket`` seconds from 0.
        served: How many of those it served, per bucket.
        calls: The outcome of each client's call, by client number.
        overload_end: When the last request was refused for overload, or
            None if none was.
        end: When the run stopped, in seconds.
        summary: The figures the CLI prints.
        transitions: The circuit breaker's state changes, in order (its
            ``at`` is the simulated time); empty without a breaker.
    """

    config: SimulationConfig
    load: tuple[int, ...]
    served: tuple[int, ...]
    calls: Calls
    overload_end: float | None
    end: float
    summary: Summary
    transitions: tuple[BreakerTransition, ...] = ()

    @property
    def times(self) -> tuple[float, ...]:
        """The start of each bucket, in seconds."""
        return tuple(i * self.config.bucket for i in range(len(self.load)))

    @property
    def failed(self) -> tuple[int, ...]:
        """Requests the dependency failed, per bucket."""
        return tuple(
            n - s for n, s in zip(self.load, self.served, strict=True)
        )

    @property
    def breaker_states(self) -> str | None:
        """
        The breaker's state per bucket of the load chart, one letter each;
        None without a breaker.

        ``H`` if the breaker was half-open at any moment of the bucket
        (it let probes through), else ``O`` if it was open at any moment,
        else ``C`` (closed throughout).
        """
        if self.config.policy.breaker is None:
            return None
        width = self.config.bucket
        letters: list[str] = []
        state = "C"
        pending = list(self.transitions)
        pending.reverse()
        for i in range(len(self.load)):
            seen = {state}
            end = (i + 1) * width
            while pending and pending[-1].at < end:
                state = _LETTER[pending.pop().new]
                seen.add(state)
            letters.append("H" if "H" in seen else "O" if "O" in seen else "C")
        return "".join(letters)

    def breaker_timeline(self) -> list[tuple[float, BreakerState]]:
        """
        The breaker's state from the start to the end of the run, as
        ``(time, state)`` steps; empty without a breaker.
        """
        if self.config.policy.breaker is None:
            return []
        steps = [(0.0, BreakerState.CLOSED)]
        steps += [(t.at, t.new) for t in self.transitions]
        steps.append((max(self.end, steps[-1][0]), steps[-1][1]))
        return steps


_LETTER: Final = {
    BreakerState.CLOSED: "C",
    BreakerState.OPEN: "O",
    BreakerState.HALF_OPEN: "H",
    BreakerState.FORCED_OPEN: "O",
}


def percentile(ordered: Sequence[float], p: float) -> float:
    """
    The *p*-th percentile (0 < p <= 100) of sorted data, by nearest rank:
    a value that occurred, not an interpolation.
    """
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _latencies(calls: Calls) -> list[float]:
    """
    How long each call that succeeded took, in call order: by C iterators
    over the columns (a million calls), but for a column of ends with a
    gap where a call succeeded, which the engine never makes.
    """
    succeeded = list(map(operator.is_, calls.reasons, itertools.repeat(None)))
    ends = itertools.compress(calls.ends, succeeded)
    starts = itertools.compress(calls.starts, succeeded)
    try:
        # No test for a gap first: ``None in ends`` compares each float
        # with None the slow way (a tenth of a second for a million).
        return list(map(operator.sub, ends, starts))
    except TypeError:
        pass
    return [
        end - start
        for start, end, reason in zip(
            calls.starts, calls.ends, calls.reasons, strict=True
        )
        if reason is None and end is not None
    ]


def _summarize(
    config: SimulationConfig,
    load: Sequence[int],
    calls: Calls,
    last_attempt: float,
    overload_end: float | None,
    *,
    refused: int,
    during_outage: int,
) -> Summary:
    width = config.bucket
    ok = sorted(_latencies(calls))
    reasons = Counter(calls.reasons)
    reasons.pop(None, None)
    attempts = sum(load)
    peak = max(range(len(load)), key=load.__getitem__, default=0)
    after = [i for i in range(len(load)) if i * width >= config.outage - 1e-9]
    peak_after = max(after, key=load.__getitem__, default=None)
    return Summary(
        calls=len(calls),
        succeeded=len(ok),
        success_rate=len(ok) / len(calls),
        give_ups=tuple(
            sorted(
                ((str(r), n) for r, n in reasons.items()),
                key=lambda rn: (-rn[1], rn[0]),
            )
        ),
        attempts=attempts,
        refused=refused,
        amplification=attempts / len(calls),
        peak=(load[peak] if load else 0, peak * width),
        peak_after_outage=(
            None
            if peak_after is None
            else (load[peak_after], peak_after * width)
        ),
        during_outage=during_outage,
        latency=(
            None
            if not ok
            else (
                percentile(ok, 50),
                percentile(ok, 90),
                percentile(ok, 99),
                ok[-1],
            )
        ),
        last_attempt=last_attempt,
        drain=max(0.0, last_attempt - config.outage),
        recovery=(
            0.0 if overload_end is None else overload_end - config.outage
        ),
    )


def collect(
    config: SimulationConfig,
    load: list[int],
    served: list[int],
    calls: Calls,
    *,
    end: float,
    last: float,
    overload_end: float | None,
    refused: int,
    during_outage: int,
    transitions: tuple[BreakerTransition, ...],
    breaker: _BreakerMachine | None,
    budget: RetryBudget | None,
) -> SimulationResult:
    """
    The result of a run from what it counted: its chart cut or padded to
    the duration, if any, and the summary with the breaker's and the retry
    budget's figures.
    """
    if config.duration is not None:
        end = config.duration
        size = max(1, math.ceil(config.duration / config.bucket - 1e-9))
        load = (load + [0] * size)[:size]
        served = (served + [0] * size)[:size]
    figures = _summarize(
        config,
        load,
        calls,
        last,
        overload_end,
        refused=refused,
        during_outage=during_outage,
    )
    if breaker is not None:
        closed = [t.at for t in transitions if t.new is _CLOSED]
        figures = attrs.evolve(
            figures,
            breaker_opened=breaker.times_opened,
            breaker_closed=(
                closed[-1] if closed and breaker.state is _CLOSED else None
            ),
        )
    if budget is not None:
        stats = budget.statistics()
        figures = attrs.evolve(
            figures,
            budget_retries=stats.total_retries,
            budget_refused=stats.refused,
            budget_calls=stats.total_calls,
        )
    return SimulationResult(
        config=config,
        load=tuple(load),
        served=tuple(served),
        calls=calls,
        overload_end=overload_end,
        end=end,
        summary=figures,
        transitions=transitions,
    )


_CLOSED: Final = BreakerState.CLOSED
