"""
The simulator's engine (`resilient._simulate._engine`): the runs, the
real machine, the breaker and the retry budget the fleet shares.
"""

from __future__ import annotations

import gc
import itertools
import math

import pytest

import resilient
from resilient import simulation as sim
from resilient._simulate import _engine, _result
from tests.simulate_runs import guarded, outage_buckets, run


pytest_plugins = ["tests.simulate_fixtures"]


class TestTheIssueCriterion:
    def test_no_jitter_spikes_full_jitter_spreads(
        self, full: sim.SimulationResult, none: sim.SimulationResult
    ) -> None:
        """
        After a 5 s outage, 1,000 clients without jitter hit the dependency
        in one synchronised wave several times its capacity; with full
        jitter the busiest bucket is several times smaller and within it.
        """
        assert none.summary.peak_after_outage is not None
        assert full.summary.peak_after_outage is not None
        spike = none.summary.peak_after_outage[0]
        spread = full.summary.peak_after_outage[0]
        per_bucket = full.config.capacity * full.config.bucket
        assert spike >= 0.9 * full.config.clients
        assert spike > 3 * per_bucket
        assert spike >= 4 * spread
        assert spread <= per_bucket

    def test_jitter_succeeds_more_with_less_work(
        self, full: sim.SimulationResult, none: sim.SimulationResult
    ) -> None:
        """
        The synchronised waves keep failing for overload, so without jitter
        fewer calls succeed, with more attempts each, and the dependency
        stays overloaded and busy for longer after the outage.
        """
        f, n = full.summary, none.summary
        assert f.success_rate > 0.95
        assert n.success_rate < 0.6
        assert f.amplification < n.amplification
        assert f.drain < n.drain
        assert full.overload_end is None
        assert none.overload_end is not None
        assert n.recovery > 10.0

    def test_every_strategy_runs_fast_enough_to_tune_with(self) -> None:
        """
        Each strategy simulates the default 1,000-client fleet and gives
        every call an outcome (no real sleeping: the whole module's runs
        would take minutes otherwise).
        """
        for strategy in sim.STRATEGIES:
            result = run(strategy)
            assert len(result.calls) == 1000
            assert all(c.end is not None for c in result.calls)


class TestConsistency:
    @pytest.mark.parametrize("strategy", sim.STRATEGIES)
    def test_figures_agree_with_the_raw_data(self, strategy: str) -> None:
        """
        The summary is derived from the per-bucket load and the per-call
        outcomes: attempts, successes, give-ups, amplification and latency
        all agree with them.
        """
        # A constant 1 s wait outlasts the outage within 10 attempts.
        base = 1.0 if strategy == "constant" else 0.2
        result = run(strategy, clients=300, base=base)
        s = result.summary
        calls = result.calls
        assert s.calls == len(calls) == 300
        assert s.attempts == sum(result.load) == sum(c.attempts for c in calls)
        assert s.succeeded == sum(c.ok for c in calls) == sum(result.served)
        assert s.succeeded + sum(n for _, n in s.give_ups) == s.calls
        assert s.success_rate == s.succeeded / s.calls
        assert s.amplification == s.attempts / s.calls
        assert s.refused == 0
        latencies = sorted(c.end - c.start for c in calls if c.end and c.ok)
        assert s.latency is not None
        assert s.latency[3] == latencies[-1]
        assert s.latency[0] == _result.percentile(latencies, 50)
        assert s.latency[0] <= s.latency[1] <= s.latency[2] <= s.latency[3]
        assert max(c.attempts for c in calls) <= 10
        assert s.peak[0] == max(result.load)

    def test_the_outage_fails_everything(
        self, full: sim.SimulationResult
    ) -> None:
        """No request is served during the outage; all of them fail."""
        width = full.config.bucket
        for t, served in zip(full.times, full.served, strict=True):
            if t + width <= full.config.outage:
                assert served == 0

    @pytest.mark.parametrize("strategy", ["exponential", "constant"])
    def test_the_dependency_never_serves_past_its_capacity(
        self, strategy: str
    ) -> None:
        """
        After the outage, no bucket serves more than its share of the
        capacity plus the burst the token bucket holds.
        """
        result = run(strategy, base=0.5, capacity=100.0)
        limit = 100.0 * result.config.bucket + result.config.tokens
        assert max(result.served) <= limit
        assert max(result.load) > limit  # The excess was sent and failed.

    def test_same_seed_same_run_other_seed_other_run(self) -> None:
        """A seed makes a run repeatable; another seed changes it."""
        a = run("full", clients=200, seed=7)
        b = run("full", clients=200, seed=7)
        c = run("full", clients=200, seed=8)
        assert a == b
        assert a.load != c.load

    def test_start_times_do_not_depend_on_the_policy(self) -> None:
        """
        Clients start at the same times whatever the strategy, so two
        strategies are compared on the same fleet.
        """
        a = run("full", clients=50)
        b = run("exponential", clients=50)
        assert [c.start for c in a.calls] == [c.start for c in b.calls]
        assert all(0 <= c.start < 0.1 for c in a.calls)


class TestTheRealMachine:
    def test_one_client_follows_the_exponential_schedule(self) -> None:
        """
        One client without jitter retries after exactly 0.2, 0.4 and 0.8 s
        (the library's `Exponential`), and its fourth attempt, after a 1 s
        outage, succeeds after the service time.
        """
        result = run(
            "exponential", clients=1, spread=0.0, outage=1.0, bucket=0.1
        )
        (call,) = result.calls
        assert call.ok
        assert call.attempts == 4
        assert call.end == pytest.approx(0.2 + 0.4 + 0.8 + 0.02)
        arrivals = [
            t for t, n in zip(result.times, result.load, strict=True) if n
        ]
        assert arrivals == pytest.approx([0.0, 0.2, 0.6, 1.4])

    def test_jitter_draws_match_the_schedule(self) -> None:
        """
        A lone client's waits are the policy's backoff drawn from the
        simulation's jitter stream: each retry lands inside its full-jitter
        window.
        """
        result = run("full", clients=1, spread=0.0, outage=100.0, bucket=0.01)
        arrivals = [
            t for t, n in zip(result.times, result.load, strict=True) if n
        ]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert len(arrivals) == 10
        for retry, gap in enumerate(gaps):
            assert 0 <= gap <= min(5.0, 0.2 * 2**retry) + 0.01

    def test_attempts_run_out(self) -> None:
        """
        A policy of 3 attempts against a long outage gives up on every call
        for ``attempts``, after exactly 3 attempts each.
        """
        result = run("full", clients=100, attempts=3, outage=60.0)
        assert result.summary.give_ups == (("attempts", 100),)
        assert {c.attempts for c in result.calls} == {3}
        assert result.summary.succeeded == 0
        assert result.summary.latency is None

    def test_the_budget_runs_out(self) -> None:
        """
        With no attempt limit, a 2 s budget gives up on every call for
        ``budget``, and no attempt starts after it.
        """
        result = run(
            "constant", clients=20, base=0.5, attempts=None, budget=2.0
        )
        assert result.summary.give_ups == (("budget", 20),)
        assert result.summary.last_attempt < 2.0 + 0.1

    def test_a_policy_that_does_not_retry_connection_errors(self) -> None:
        """
        The simulated failures are `ConnectionError`s: a policy that does
        not retry them gives up at once for ``not_retryable``.
        """
        policy = resilient.Policy(name="strict", retry_on=KeyError)
        result = sim.simulate(sim.SimulationConfig(clients=10, policy=policy))
        assert result.summary.give_ups == (("not_retryable", 10),)
        assert result.summary.amplification == 1.0

    def test_a_policy_that_never_waits_is_stopped(self) -> None:
        """
        Retrying without waiting and without an attempt limit would never
        advance virtual time: the simulator stops and says why.
        """
        policy = resilient.Policy(
            attempts=None, budget=1.0, backoff=resilient.Constant(seconds=0)
        )
        config = sim.SimulationConfig(clients=1, policy=policy)
        with pytest.raises(RuntimeError, match="retry without end"):
            sim.simulate(config)

    def test_duration_stops_the_run(self) -> None:
        """
        With a duration, the chart covers exactly that long and calls still
        going at the end count as unfinished.
        """
        result = run("exponential", clients=100, duration=4.0, outage=5.0)
        assert len(result.load) == 8
        assert result.end == 4.0
        assert result.summary.give_ups == (("unfinished", 100),)
        assert all(c.end is None and c.latency is None for c in result.calls)


def test_the_virtual_clock_never_sleeps() -> None:
    """
    The clients' machines read the simulation's clock; nothing may sleep on
    it (waits are events on the heap), so a sleep is a bug and raises.
    """
    clock = _engine._VirtualClock()
    assert clock.now() == 0.0
    with pytest.raises(RuntimeError, match="never sleeps"):
        clock.sleep(1.0)
    coro = clock.asleep(1.0)
    with pytest.raises(RuntimeError, match="never sleeps"):
        coro.send(None)


class TestTheGuardSeam:
    def test_a_guard_refuses_attempts_before_they_are_sent(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """
        The per-client loop tells the fleet's guard when each call begins,
        asks it before each attempt and tells it each outcome: a guard that
        refuses every retry with a non-transient error keeps retries off the
        dependency, and the refusals are counted apart from the load.
        """
        heard: list[tuple[int, bool]] = []
        begun: list[float] = []
        attempts: dict[int, int] = {}

        class OnlyFirstAttempts:
            def begin(self, now: float) -> None:
                begun.append(now)

            def admit(
                self, now: float, call: int, attempt: int
            ) -> Exception | None:
                attempts[call] = attempt
                if attempt == 1:
                    return None
                return KeyError("refused")

            def record(
                self, now: float, call: int, error: Exception | None
            ) -> None:
                heard.append((attempts[call], error is None))

        monkeypatch.setattr(
            _engine, "_guard", lambda config, clock: OnlyFirstAttempts()
        )
        result = run("full", clients=40)
        s = result.summary
        assert s.attempts == sum(result.load) == 40
        assert s.refused == 40
        assert s.give_ups == (("not_retryable", 40),)
        assert heard == [(1, False)] * 40
        assert sorted(begun) == sorted(c.start for c in result.calls)
        assert "breaker rejected   40 attempts" in sim.render_summary(result)


class TestRetryBudget:
    def test_the_budget_cuts_the_storm_of_a_burst(
        self, full: sim.SimulationResult, budgeted: sim.SimulationResult
    ) -> None:
        """
        With a retry budget, the burst of 1,000 failing calls gets the
        retries the budget allows and no more: ratio * calls + min_per_second
        * window of them, so the peak and the total load are a fraction of
        the unbudgeted fleet's; the other calls give up for
        ``retry_budget`` instead of retrying into the outage.
        """
        b, f = budgeted.summary, full.summary
        config = resilient.RetryBudgetConfig()
        allowed = config.ratio * 1000 + config.min_per_second * config.window
        assert b.budget_retries == round(allowed)
        assert b.attempts == 1000 + b.budget_retries
        assert b.during_outage == b.attempts
        assert b.peak[0] <= 0.5 * f.peak[0]
        assert b.attempts <= 0.25 * f.attempts
        assert b.budget_refused is not None
        assert dict(b.give_ups)["retry_budget"] == b.budget_refused > 0
        assert b.refused == 0  # No attempt is refused: the call gives up.
        assert budgeted.transitions == ()
        assert budgeted.breaker_states is None

    def test_under_steady_traffic_the_load_stays_near_the_traffic(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        Under steady traffic, the retry budget keeps the load during the
        outage near the calls' own rate (plus the budget's share) instead
        of several times it, the peak after the outage under the capacity,
        and the total well under the unbudgeted total.
        """
        plain, budget = steady["plain"].summary, steady["budget"].summary
        assert plain.calls == budget.calls
        assert budget.during_outage <= 0.3 * plain.during_outage
        assert budget.peak[0] <= 0.5 * plain.peak[0]
        assert plain.peak_after_outage is not None
        assert budget.peak_after_outage is not None
        assert budget.peak_after_outage[0] <= 0.3 * plain.peak_after_outage[0]
        assert budget.attempts <= 0.4 * plain.attempts
        assert budget.amplification < 1.2 < plain.amplification
        assert dict(budget.give_ups)["retry_budget"] > 0
        assert steady["budget"].overload_end is None
        # Calls that start after the outage succeed at once.
        late = [c for c in steady["budget"].calls if c.start >= 6.0]
        assert late
        assert all(c.ok and c.attempts == 1 for c in late)

    def test_the_budget_reads_simulated_time(self) -> None:
        """
        The budget's window moves with the simulation's clock: a long
        outage with steady traffic gets a fresh allowance every window, so
        retries keep flowing at about ratio * rate + min_per_second.
        """
        result = guarded(
            retry_budget=True,
            clients=1,
            rate=100.0,
            rate_until=40.0,
            outage=40.0,
        )
        s = result.summary
        assert s.budget_retries is not None
        per_second = s.budget_retries / 40.0
        assert 0.8 * (0.2 * 100 + 10) <= per_second <= 1.2 * (0.2 * 100 + 10)


class TestBreaker:
    def test_rejections_appear_and_the_outage_sees_only_probes(
        self, full: sim.SimulationResult, broken: sim.SimulationResult
    ) -> None:
        """
        The breaker opens on the first failures and rejects the fleet's
        retries (they are never sent): during the outage the dependency
        sees the calls that tripped it and then one probe per open
        interval (each fails at once and re-opens it), a tiny fraction of
        the unguarded fleet's load.
        """
        s = broken.summary
        breaker = broken.config.policy.breaker
        assert breaker is not None
        assert s.refused > broken.config.clients
        probes = breaker.half_open_probes * math.ceil(
            broken.config.outage / breaker.open_interval
        )
        assert s.during_outage <= breaker.minimum_calls + probes
        assert s.during_outage <= 0.01 * full.summary.during_outage
        for n in broken.load[1 : outage_buckets(broken)]:
            assert n <= breaker.half_open_probes
        first = broken.transitions[0]
        assert (first.new, first.reason) == (
            resilient.BreakerState.OPEN,
            "failure_rate",
        )
        during = [t for t in broken.transitions if t.at < 5.0]
        assert {t.reason for t in during} == {
            "failure_rate",
            "open_interval_passed",
            "probe_failed",
        }

    def test_the_breaker_closes_after_recovery(
        self, broken: sim.SimulationResult
    ) -> None:
        """
        Once the dependency is back, the half-open probes succeed and the
        breaker closes; the run's state timeline ends closed, and the
        letters show open and half-open during the outage.
        """
        s = broken.summary
        closes = [
            t
            for t in broken.transitions
            if t.new is resilient.BreakerState.CLOSED
        ]
        assert closes
        assert closes[0].at >= broken.config.outage
        assert closes[0].reason == "probes_succeeded"
        assert s.breaker_closed == closes[-1].at
        assert s.breaker_opened == sum(
            t.new is resilient.BreakerState.OPEN for t in broken.transitions
        )
        assert (
            broken.breaker_timeline()[-1][1] is resilient.BreakerState.CLOSED
        )
        states = broken.breaker_states
        assert states is not None
        assert len(states) == len(broken.load)
        outage = states[: outage_buckets(broken)]
        assert set(outage) == {"O", "H"}
        assert "C" in states[outage_buckets(broken) :]

    def test_breaker_states_follow_the_transitions(
        self, broken: sim.SimulationResult
    ) -> None:
        """
        A bucket's letter is H if the breaker was half-open at any moment
        in it, else O if it was open at any moment, else C.
        """
        states = broken.breaker_states
        assert states is not None
        steps = broken.breaker_timeline()
        width = broken.config.bucket
        letter = {
            resilient.BreakerState.CLOSED: "C",
            resilient.BreakerState.OPEN: "O",
            resilient.BreakerState.HALF_OPEN: "H",
        }
        for i, got in enumerate(states):
            lo, hi = i * width, (i + 1) * width
            seen = {
                letter[state]
                for (t, state), (t_next, _) in itertools.pairwise(steps)
                if t < hi and (t_next >= lo or t_next == t >= lo)
            }
            want = "H" if "H" in seen else "O" if "O" in seen else "C"
            assert got == want, i

    def test_with_steady_traffic_and_a_budget(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        Under steady traffic the breaker still holds the outage's load to
        the probes and closes after recovery; rejections are not attempts
        and spend no retry budget, so adding a budget changes nothing while
        the budget's floor covers the retries. The budget alone cuts the
        total load below the plain fleet's.
        """
        s = {name: r.summary for name, r in steady.items()}
        for name in ("breaker", "both"):
            assert s[name].during_outage <= 0.01 * s["plain"].during_outage
            assert s[name].refused > 0
            closed = s[name].breaker_closed
            assert closed is not None
            assert closed >= 5.0
            timeline = steady[name].breaker_timeline()
            assert timeline[-1][1] is resilient.BreakerState.CLOSED
            assert s[name].success_rate > s["budget"].success_rate
        assert s["budget"].attempts < 0.5 * s["plain"].attempts
        assert dict(s["budget"].give_ups)["retry_budget"] > 0

    def test_the_budget_counts_each_call_once(
        self, steady: dict[str, sim.SimulationResult]
    ) -> None:
        """
        The retry budget counts every call exactly once, however many times
        the breaker rejected it before its first try went out (a rejection
        does not advance the attempt number).
        """
        both = steady["both"]
        assert both.summary.budget_calls == len(both.calls)
        assert both.summary.budget_refused > 0

    def test_a_breaker_that_never_opens(self) -> None:
        """
        Without an outage and with ample capacity, the breaker stays closed
        and rejects nothing; the figures say it never opened.
        """
        result = guarded(breaker=True, clients=100, outage=0.0)
        assert result.transitions == ()
        assert result.summary.refused == 0
        assert result.summary.breaker_opened == 0
        assert result.summary.breaker_closed is None
        assert set(result.breaker_states or "") == {"C"}
        text = sim.render_summary(result)
        assert "breaker            opened 0 times, never opened" in text

    def test_a_breaker_still_open_at_the_end(self) -> None:
        """
        When every call has given up while the breaker is open (an outage
        longer than any call's budget), the figures say it was still open
        when the run ended.
        """
        result = guarded(breaker=True, retry_budget=True, outage=60.0)
        assert result.summary.breaker_closed is None
        assert result.breaker_timeline()[-1][1] is not (
            resilient.BreakerState.CLOSED
        )
        assert "still open at the end" in sim.render_summary(result)


class TestSteadyTraffic:
    def test_steady_calls_arrive_on_top_of_the_burst(
        self,
        full: sim.SimulationResult,
        steady: dict[str, sim.SimulationResult],
    ) -> None:
        """
        ``rate`` adds about rate * rate_until calls at random times before
        ``rate_until``, numbered after the clients; the clients' own start
        times do not change.
        """
        result = steady["plain"]
        extra = result.calls[1000:]
        assert 0.9 * 200 * 20 <= len(extra) <= 1.1 * 200 * 20
        assert all(0 < c.start < 20.0 for c in extra)
        assert [c.start for c in extra] == sorted(c.start for c in extra)
        assert [c.client for c in result.calls] == list(
            range(len(result.calls))
        )
        assert [c.start for c in result.calls[:1000]] == [
            c.start for c in full.calls
        ]

    def test_every_guard_is_deterministic_for_a_seed(self) -> None:
        """
        The same configuration (seed included), breaker, budget and steady
        traffic all on, gives the same run; another seed another run.
        """
        a = guarded(breaker=True, retry_budget=True, rate=50.0, clients=200)
        b = guarded(breaker=True, retry_budget=True, rate=50.0, clients=200)
        c = guarded(
            breaker=True, retry_budget=True, rate=50.0, clients=200, seed=1
        )
        assert a == b
        assert a.transitions == b.transitions
        assert a.calls != c.calls


class TestTheProcessClock:
    def test_simulate_restores_the_clock(
        self, clock: resilient.testing.FakeClock
    ) -> None:
        """
        After a run with a retry budget, the process's clock is the one it
        was before.
        """
        from resilient._core import _clock

        guarded(retry_budget=True, clients=20)
        assert _clock.get_clock() is clock

    def test_the_clock_is_swapped_only_for_a_budget_that_reads_it(
        self,
        clock: resilient.testing.FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """
        A `RetryBudget` that takes a clock reads the simulation's, and the
        process's clock is left alone; one that reads only the process's
        clock gets it pointed at the simulation's for the run.
        """
        from resilient._core import _clock

        seen: list[object] = []
        real = _engine._Run.run

        def spy(self: _engine._Run) -> None:
            seen.append(_clock.get_clock())
            real(self)

        monkeypatch.setattr(_engine._Run, "run", spy)
        result = guarded(retry_budget=True, clients=20)
        assert (seen == [clock]) is _engine._BUDGET_TAKES_A_CLOCK
        assert result.summary.budget_calls == 20

    def test_simulate_restores_the_clock_on_error(
        self,
        clock: resilient.testing.FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """
        The process's clock is the previous one after a run that raised,
        with a retry budget too.
        """
        from resilient._core import _clock

        def fail(self: object) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(_engine._Run, "run", fail)
        with pytest.raises(RuntimeError, match="boom"):
            guarded(retry_budget=True, clients=1)
        assert _clock.get_clock() is clock

    def test_without_a_retry_budget_the_clock_is_left_alone(
        self,
        clock: resilient.testing.FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """
        Without a retry budget the clock is never swapped, so a run may
        share the process with real calls (the breaker's machine and the
        clients' machines take the simulated time as an argument).
        """
        from resilient._core import _clock

        seen: list[object] = []
        real = _engine._Run.run

        def spy(self: _engine._Run) -> None:
            seen.append(_clock.get_clock())
            real(self)

        monkeypatch.setattr(_engine._Run, "run", spy)
        guarded(breaker=True, clients=20)
        assert seen == [clock]


class TestTheEngineCost:
    def test_heap_work_is_bounded_by_time_not_by_the_fleet(self) -> None:
        """
        The calendar queue pushes in O(1): its heap (of time slots, 1/1024 s
        each) is pushed and popped at most once per slot the run spans,
        whatever the number of events, and an event goes into the slot
        being run (a sorted insertion) only for a wait under a millisecond,
        which is rare.
        """
        config = sim.SimulationConfig(clients=5000)
        run_ = _engine._Run(config, _engine._VirtualClock())
        run_.run()
        result = run_.result()
        calendar = run_.calendar
        slots_spanned = math.ceil(result.end * 1024) + 1
        assert calendar.heap_ops - calendar.inserts <= 2 * slots_spanned
        assert calendar.inserts < 0.01 * result.summary.attempts
        assert result.summary.attempts > 2 * slots_spanned

    def test_the_calendar_keeps_heap_order(self) -> None:
        """
        Events come out of the calendar in (time, push order) order, ties
        and far times included, exactly as from a heap: the same run as
        before the calendar, draw for draw.
        """
        times = [0.5, 0.0, 0.5, 1e-9, 3.0, 0.0, 2.0**-10, 1e308, 1e308]
        calendar = _engine._Calendar(times)
        out = []
        while (events := calendar.next_slot()) is not None:
            out += events
        assert out == sorted((at, seq) for seq, at in enumerate(times))

    def test_waits_under_a_millisecond_keep_their_order(self) -> None:
        """
        A retry due within the calendar slot being run (here every wait is
        0: testing mode) is put in its place in that slot, after the events
        already due at the same time: attempts still come one per client
        in turn, and the run ends.
        """
        with resilient.testing.set_testing(True):
            result = run("full", clients=30, outage=1.0, spread=0.0)
        assert result.summary.attempts == 30 * 10
        assert result.summary.give_ups == (("attempts", 30),)

    def test_the_collector_is_back_on_after_a_run(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """
        The cyclic garbage collector is off while a run makes its millions
        of objects, and on again after it, even when the run raises.
        """
        seen: list[bool] = []
        real = _engine._Run.run

        def spy(self: _engine._Run) -> None:
            seen.append(gc.isenabled())
            real(self)

        monkeypatch.setattr(_engine._Run, "run", spy)
        assert gc.isenabled()
        sim.simulate(sim.SimulationConfig(clients=10))
        assert seen == [False]
        assert gc.isenabled()

        def fail(self: object) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(_engine._Run, "run", fail)
        with pytest.raises(RuntimeError, match="boom"):
            sim.simulate(sim.SimulationConfig(clients=1))
        assert gc.isenabled()

    def test_a_run_stopped_early_makes_no_late_clients(self) -> None:
        """
        A call's machine is made at its first failure, never before its
        start: with a duration that ends before most calls start, those
        calls are unfinished with one attempt counted and no end, as before.
        """
        result = sim.simulate(
            sim.SimulationConfig(clients=100, spread=10.0, duration=1.0)
        )
        late = [c for c in result.calls if c.start >= 1.0]
        assert late
        assert all(
            (c.end, c.attempts, c.ok, c.reason)
            == (None, 1, False, "unfinished")
            for c in late
        )

    def test_a_request_served_past_the_duration_is_unfinished(self) -> None:
        """
        A request the dependency served whose service ends after the run's
        duration leaves its call unfinished (no end, one attempt), with or
        without a breaker waiting on that end.
        """
        for breaker in (False, True):
            result = guarded(
                breaker=breaker,
                clients=1,
                outage=0.0,
                spread=0.0,
                service_time=1.0,
                duration=0.5,
            )
            (call,) = result.calls
            assert (call.end, call.attempts, call.reason) == (
                None,
                1,
                "unfinished",
            )
            assert result.served[0] == 1


class TestTheCallColumns:
    def test_calls_are_columns_equal_to_the_outcomes(
        self, full: sim.SimulationResult
    ) -> None:
        """
        A run's calls are a `Calls` over four columns, one entry per call,
        equal to the tuple of `CallOutcome` it stands for (and to another
        `Calls` with the same columns), indexable and sliceable like it,
        and hashable with the frozen result.
        """
        calls = full.calls
        assert isinstance(calls, sim.Calls)
        outcomes = tuple(calls)
        assert len(calls.starts) == len(calls.ends) == len(outcomes) == 1000
        assert calls == outcomes
        assert calls == list(outcomes)
        assert calls != outcomes[:-1]
        assert calls != "not calls"
        assert calls[-1] == outcomes[-1] == calls[999]
        assert calls[10:13] == outcomes[10:13]
        assert [c.client for c in calls[10:13]] == [10, 11, 12]
        copy = sim.Calls(
            calls.starts, calls.ends, calls.attempts, calls.reasons
        )
        assert copy == calls
        assert hash(copy) == hash(calls)
        assert hash(full) == hash(full)
        assert (calls.attempts[0], calls.reasons[0]) == (
            outcomes[0].attempts,
            outcomes[0].reason,
        )
        assert repr(calls) == "<Calls: 1000 calls>"
        with pytest.raises(IndexError):
            calls[1000]

    def test_columns_of_different_lengths_are_refused(self) -> None:
        """A `Calls` whose columns differ in length is never made."""
        with pytest.raises(ValueError, match="differ in length"):
            sim.Calls([0.0], [None], [1, 1], ["unfinished"])


class TestTheBuckets:
    @pytest.mark.parametrize("width", [0.5, 0.1, 0.3, 1.0, 1e-3, 7.0])
    def test_a_bucket_and_its_end_are_exact(self, width: float) -> None:
        """
        `_Buckets.at` gives the bucket ``int(now // width)`` would, and the
        smallest time of a later bucket: the float just below it is still
        in *now*'s bucket. (The run asks it once per bucket, so any error
        here would move a request into the wrong bucket.)
        """
        buckets = _engine._Buckets(width)
        for k in range(0, 2000, 7):
            for now in (k * width, k * width * (1 + 1e-16), (k + 0.5) * width):
                index, end = buckets.at(now)
                assert index == int(now // width)
                assert end // width > index
                assert math.nextafter(end, -math.inf) // width <= index
                assert end > now
