"""
The classifiers' reprs are short and evaluate back to an equal classifier:
`DependencyFailure()` printed all 101 codes of its default statuses in
hash order, and the method and class sets in an order that changed between
runs.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from resilient import DependencyFailure, Transient


_SCOPE = {
    "DependencyFailure": DependencyFailure,
    "Transient": Transient,
    "ValueError": ValueError,
    "KeyError": KeyError,
    "json": json,
}


def test_default_failure_statuses_print_as_a_range() -> None:
    """`DependencyFailure()`'s 429 and 5xx read as one short display."""
    text = repr(DependencyFailure())
    assert text == (
        "DependencyFailure(also=(), never=(), "
        "statuses={429, *range(500, 600)})"
    )
    assert eval(text, _SCOPE) == DependencyFailure()  # noqa: S307


def test_transient_repr_is_sorted_and_evaluates_back() -> None:
    """`Transient`'s statuses and methods print sorted, its classes by
    name, and the repr evaluates back to an equal classifier."""
    default = Transient()
    assert repr(default) == (
        "Transient(also=(), never=(), statuses={429, 502, 503, 504}, "
        "idempotent_methods={'DELETE', 'GET', 'HEAD', 'OPTIONS', 'PUT', "
        "'TRACE'}, idempotency_header='Idempotency-Key')"
    )
    custom = Transient(
        statuses=range(500, 600),
        also=ValueError,
        never=[json.JSONDecodeError, KeyError],
        idempotent_methods=None,
    )
    text = repr(custom)
    assert "also=(ValueError,)" in text
    assert "never=(json.decoder.JSONDecodeError, KeyError)" in text
    assert "statuses={*range(500, 600)}" in text
    for classifier in (default, custom, Transient(statuses=())):
        assert eval(repr(classifier), _SCOPE) == classifier  # noqa: S307


@given(st.frozensets(st.integers(100, 599)))
def test_any_status_set_round_trips(codes: frozenset[int]) -> None:
    """Whatever the codes (runs, gaps, none at all), the repr evaluates
    back to the same set, lists each code once, and stays short for
    long runs."""
    for cls in (Transient, DependencyFailure):
        classifier = cls(statuses=codes)
        text = repr(classifier)
        back = eval(text, _SCOPE)  # noqa: S307
        assert back == classifier
        assert back.statuses == codes
    assert len(repr(DependencyFailure(statuses=range(100, 600)))) < 80
