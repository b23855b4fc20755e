"""
The ``python`` blocks of docs/http.md and docs/migration.md run as written
(sphinx's doctest runs only the ``{doctest}`` blocks): the HTTP guide's
against a real local server, the migration page's `resilient` halves with
the behaviour their tables describe. The aiohttp block of http.md is left
out (aiohttp is not a test dependency; the audit ran it by hand).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

import resilient
import resilient.http
import resilient.testing
from tests.http_server import Server


DOCS = Path(__file__).resolve().parent.parent / "docs"


def _blocks(page: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def _namespace(**extra: Any) -> dict[str, Any]:
    name = f"payments-{uuid.uuid4().hex[:8]}"
    return {
        "__name__": "docs",
        "resilient": resilient,
        "httpx": httpx,
        "requests": requests,
        "payments": resilient.Policy(
            name=name, timeout=2.0, backoff=resilient.Constant(0)
        ),
        **extra,
    }


def test_http_guide_blocks_are_all_here() -> None:
    """The blocks the tests below run are the page's (so they cannot pass
    on a page that lost them)."""
    firsts = [b.splitlines()[0] for b in _blocks("http.md")]
    assert firsts == [
        "api = resilient.Policy(",
        (
            "@resilient.http.idempotent  # one key per call, shared by its "
            "retries"
        ),
        "import httpx",
        "session = requests.Session()",
        "api = resilient.Policy(",
        "@payments",
    ]


def test_http_guide_idempotent_post(server: Server) -> None:
    """The idempotency-key example: a POST answered 502 then 200 is
    retried, both attempts with one key."""
    block = _blocks("http.md")[2].replace(
        "https://payments.example/charges", server.url + "/script/c/502,200"
    )
    ns = _namespace()
    exec(compile(block, "http.md", "exec"), ns)  # noqa: S102
    with pytest.raises(ValueError, match="Expecting value"):
        ns["charge"]({"amount": 1})  # the test server answers text
    keys = [h.get("Idempotency-Key") for _, _, h in server.seen]
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys == [keys[0]] * 2


def test_http_guide_requests_adapter_and_statuses() -> None:
    """The statuses and the requests-adapter blocks run."""
    blocks = _blocks("http.md")
    ns = _namespace()
    exec(compile(blocks[0], "http.md", "exec"), ns)  # noqa: S102
    assert 500 in ns["api"].retry_on.statuses
    exec(compile(blocks[3], "http.md", "exec"), ns)  # noqa: S102
    adapter = ns["session"].get_adapter("https://x.example/")
    assert isinstance(adapter, resilient.http.IdempotencyKeyAdapter)


def test_http_guide_gave_up_on_result(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last_result="raise" example prints what a real run gives: the
    503 and the attempt count."""
    block = _blocks("http.md")[4].replace(
        "https://api.example/orders", server.url + "/status/503"
    )
    ns = _namespace(client=httpx.Client())
    with resilient.testing.set_testing(True):
        exec(compile(block, "http.md", "exec"), ns)  # noqa: S102
    assert capsys.readouterr().out == "still failing: 503 after 4\n"


def test_http_guide_deadline_headers(server: Server) -> None:
    """The deadline example sends grpc-timeout under a deadline and no
    such header without one (an empty one would be malformed)."""
    block = _blocks("http.md")[5].replace(
        "https://payments.example/charges", server.url + "/ok"
    )
    ns = _namespace(client=httpx.Client())
    exec(compile(block, "http.md", "exec"), ns)  # noqa: S102
    with pytest.raises(ValueError, match="Expecting value"):
        ns["charge"]({})
    assert re.fullmatch(r"\d+u", server.seen[-1][2]["grpc-timeout"])
    ns["payments"] = resilient.Policy(name="audit-unbounded", budget=None)
    exec(compile(block, "http.md", "exec"), ns)  # noqa: S102
    with pytest.raises(ValueError, match="Expecting value"):
        ns["charge"]({})
    assert "grpc-timeout" not in server.seen[-1][2]


def _resilient_half(block: str) -> str:
    return block[block.index("# resilient") :]


def test_migration_blocks_are_all_here() -> None:
    """Three code pairs: tenacity, stamina, pybreaker."""
    heads = [b.splitlines()[0] for b in _blocks("migration.md")]
    assert [h.split(":")[0] for h in heads] == [
        "# tenacity",
        "# stamina",
        "# pybreaker",
    ]


def test_migration_tenacity_and_stamina_halves() -> None:
    """The resilient halves run and configure what their peers' halves
    say: 4 attempts in 10 s on the built-ins for tenacity's, 10 attempts
    in 45 s for stamina's."""
    tenacity, stamina = _blocks("migration.md")[:2]
    ns = _namespace()
    exec(compile(_resilient_half(tenacity), "migration.md", "exec"), ns)  # noqa: S102
    assert ns["payments"].attempts == 4
    assert ns["payments"].budget == 10.0
    assert ns["payments"].retry_on == (ConnectionError, TimeoutError)
    assert ns["charge"]("order") is None
    exec(compile(_resilient_half(stamina), "migration.md", "exec"), ns)  # noqa: S102
    assert ns["fetch"]("url") is None


def test_migration_pybreaker_half_behaves_as_the_tables_say() -> None:
    """Four failures, a success, then five failures in a row open it; the
    call that trips it raises its own error (the documented difference)
    and the next one `CircuitOpen`; any exception counts."""
    block = _resilient_half(_blocks("migration.md")[2])
    ns = _namespace()
    exec(compile(block, "migration.md", "exec"), ns)  # noqa: S102
    breaker = ns["db_breaker"]
    failing = [True]

    @breaker
    def query() -> str:
        if failing[0]:
            raise KeyError("a bug counts, as in pybreaker")
        return "rows"

    for _ in range(4):
        with pytest.raises(KeyError):
            query()
    failing[0] = False
    assert query() == "rows"
    failing[0] = True
    for _ in range(5):
        with pytest.raises(KeyError):
            query()
    assert breaker.state is resilient.BreakerState.OPEN
    with pytest.raises(resilient.CircuitOpen):
        query()
