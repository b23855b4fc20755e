"""
The resource's side of fencing: apply a write only if its token is newer.

A lease cannot stop a holder that paused past its TTL from acting; the
resource can, by refusing a write whose fencing token is not greater than
the last one it accepted. `fenced_update` writes that check into the
``UPDATE`` itself, so the check and the write are one atomic statement.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from resilient.exceptions import ConfigError, ConfigTypeError


if TYPE_CHECKING:
    from collections.abc import Mapping


def quote_identifier(name: str | tuple[str, ...]) -> str:
    """
    An SQL identifier in double quotes (``"a""b"``), or a dotted one from a
    tuple (``("public", "jobs")``); NUL and empty names are refused.
    """
    parts = (name,) if isinstance(name, str) else name
    if not parts or not all(isinstance(p, str) for p in parts):
        raise ConfigTypeError(
            "fenced_update(identifier)", name, "must be a str or tuple of str"
        )
    for part in parts:
        if not part or "\0" in part:
            raise ConfigError(
                "fenced_update(identifier)", part, "must be non-empty, no NUL"
            )
    return ".".join('"' + p.replace('"', '""') + '"' for p in parts)


def _placeholder(conn: Any) -> str:
    """The DB-API placeholder of *conn*'s driver: ``?`` or ``%s``."""
    module = sys.modules.get(type(conn).__module__.partition(".")[0])
    style = getattr(module, "paramstyle", "qmark")
    if style == "qmark":
        return "?"
    if style in {"format", "pyformat"}:
        return "%s"
    raise ConfigError(
        "fenced_update(conn)", style, "needs a qmark or format paramstyle"
    )


def fence_guard(column: str = "fence", placeholder: str = "?") -> str:
    """
    The SQL condition that admits a write with a newer token: ``("fence"
    IS NULL OR "fence" < ?)``; pass the token for the placeholder. For
    statements you write yourself; `fenced_update` uses it.
    """
    col = quote_identifier(column)
    return f"({col} IS NULL OR {col} < {placeholder})"


def fenced_update(
    conn: Any,
    table: str | tuple[str, ...],
    values: Mapping[str, object],
    *,
    where: Mapping[str, object],
    token: int,
    fence_column: str = "fence",
) -> bool:
    """
    ``UPDATE table SET values..., fence = token WHERE where... AND fence <
    token``, in one statement: the write is applied only if *token* is
    newer than the one that wrote the row last.

    Works with `sqlite3`, psycopg and any DB-API connection whose driver
    uses ``?`` or ``%s`` placeholders. The caller commits (or runs it in
    autocommit); the identifiers are quoted, the values are parameters.

    Example::

        with resilient.lock("report") as lease:
            text = build_report()
            if not resilient.fenced_update(
                db, "reports", {"body": text}, where={"id": 1},
                token=lease.token,
            ):
                raise RuntimeError("a newer holder wrote the report")
            db.commit()

    Args:
        conn: A DB-API connection (or anything with ``execute`` returning
            a cursor with ``rowcount``).
        table: The table's name, or ``(schema, table)``.
        values: Columns to set and their values.
        where: Columns and values that pick the row(s); at least one.
        token: The lease's fencing token (`Lease.token`).
        fence_column: The column that keeps the last accepted token.

    Returns:
        Whether a row was written: False if the row's fence is already at
        or past *token* (a stale writer), or no row matched.
    """
    if isinstance(token, bool) or not isinstance(token, int):
        raise ConfigTypeError("fenced_update(token)", token, "must be an int")
    if not where:
        raise ConfigError(
            "fenced_update(where)", where, "needs at least one column"
        )
    mark = _placeholder(conn)
    sets = [f"{quote_identifier(c)} = {mark}" for c in values]
    sets.append(f"{quote_identifier(fence_column)} = {mark}")
    conds = [f"{quote_identifier(c)} = {mark}" for c in where]
    conds.append(fence_guard(fence_column, mark))
    sql = (
        f"UPDATE {quote_identifier(table)} SET {', '.join(sets)} "  # noqa: S608
        f"WHERE {' AND '.join(conds)}"
    )
    params = [*values.values(), token, *where.values(), token]
    cursor = conn.execute(sql, params)
    return bool(cursor.rowcount and cursor.rowcount > 0)
