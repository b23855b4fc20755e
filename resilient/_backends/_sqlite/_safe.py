"""
The embedded store's files, opened safely, and its errors, named.

**Who may write there.** The database, its ``-wal`` and ``-shm`` and the
lock directory ``<db>.locks`` must be regular files (a directory) owned by
this process's effective uid, and no one else may be able to replace them:
the directory that holds the database is owned by us or by root and is not
writable by group or others unless it is sticky (``/tmp``) or the group is
our private group (named after us, no other member: ``umask 002``); the
lock directory is ours and likewise. A symbolic link is never followed: every
file is opened with ``O_NOFOLLOW``, the lock files relative to the lock
directory's descriptor (the ``*at`` calls), so a link or a file planted by
another user is refused with an error naming it, and nothing outside the
directory is ever opened, truncated or written (OpenSSH's
``safe_path``, ``tempfile``'s ``O_EXCL|O_NOFOLLOW``). A lock file must have
one link: a hard link to some other file is refused too.

**Errors.** An error that trying again cannot cure (no such directory,
permission denied, read-only filesystem, a file where a directory should
be, a link, a NUL byte) is a `LockBackendError` with ``retryable`` False,
raised at once naming the path and the cause; the lock does not wait it
out. Others (``EMFILE``, ``ENOSPC``, ``database is locked``) are retryable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
from typing import Final

from resilient.exceptions import LockBackendError


#: errno values no retry can cure: a misconfigured or hostile path.
PERMANENT: Final = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EINVAL,
        errno.ENXIO,
        errno.ENODEV,
        errno.EEXIST,
    }
)

#: SQLite result codes (primary) no retry can cure: READONLY, CANTOPEN,
#: PERM, AUTH, NOTADB, CORRUPT.
_SQLITE_PERMANENT: Final = frozenset({8, 14, 3, 23, 26, 11})

#: Flags of every open: never follow a link, never leak into a child.
NOFOLLOW: Final = os.O_NOFOLLOW | os.O_CLOEXEC


class Unsafe(OSError):
    """A path the store refuses to use (a link, another owner, ...)."""


def failure(where: object, exc: BaseException) -> LockBackendError:
    """
    The `LockBackendError` of *exc* raised for the store at *where*:
    not retryable when no retry can cure it. Names the path and the cause.
    """
    if isinstance(exc, LockBackendError):
        return exc
    if isinstance(exc, Unsafe):
        return LockBackendError(
            "sqlite", "unsafe", str(exc), retryable=False, where=str(where)
        )
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno or 0, "OSError")
        what = exc.strerror or str(exc)
        path = f"{exc.filename}: " if exc.filename is not None else ""
        return LockBackendError(
            "sqlite",
            code,
            f"{path}{what}",
            retryable=exc.errno not in PERMANENT,
            where=str(where),
        )
    if isinstance(exc, sqlite3.Error):
        number = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        return LockBackendError(
            "sqlite",
            getattr(exc, "sqlite_errorname", None) or type(exc).__name__,
            str(exc),
            retryable=number not in _SQLITE_PERMANENT,
            where=str(where),
        )
    # ValueError: a NUL byte in the path.
    return LockBackendError(
        "sqlite",
        type(exc).__name__,
        str(exc),
        retryable=False,
        where=repr(where),
    )


def _owner_ok(st: os.stat_result, *, root_too: bool) -> bool:
    uid = os.geteuid()
    return st.st_uid == uid or (root_too and st.st_uid == 0)


def _check_ours(shown: str, st: os.stat_result) -> None:
    if not _owner_ok(st, root_too=False):
        raise Unsafe(
            f"{shown}: owned by uid {st.st_uid}, not by this process's uid "
            f"{os.geteuid()}"
        )


def check_parent(path: str) -> None:
    """
    Refuse the directory *path* that holds the database if someone other
    than us (or root) owns it, or others can write it and it is not sticky.
    """
    st = os.stat(path)  # noqa: PTH116 - the directory may be a link
    if not stat.S_ISDIR(st.st_mode):
        raise Unsafe(errno.ENOTDIR, "not a directory", path)
    if not _owner_ok(st, root_too=True):
        raise Unsafe(f"{path}: owned by uid {st.st_uid}, not by us or root")
    _check_mode(path, st)


def _private_group(gid: int) -> bool:
    """
    Whether *gid* is this user's own group (named after the user, no
    other member), as with a ``umask`` of 002 and user private groups.
    """
    import grp  # noqa: PLC0415
    import pwd  # noqa: PLC0415

    try:
        user = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return (
        user.pw_gid == gid
        and group.gr_name == user.pw_name
        and set(group.gr_mem) <= {user.pw_name}
    )


def _check_mode(path: str, st: os.stat_result) -> None:
    mode = st.st_mode
    if mode & stat.S_ISVTX or not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return
    if not mode & stat.S_IWOTH and _private_group(st.st_gid):
        return
    raise Unsafe(
        f"{path}: writable by group or others and not sticky "
        f"(mode {stat.S_IMODE(mode):o}): others could replace the "
        "store's files (chmod go-w, or +t)"
    )


def open_dir(path: str) -> int:
    """
    The lock directory *path*, made (mode 0700) if missing, opened without
    following a link and checked: ours, not writable by others unless
    sticky. Its descriptor (``O_CLOEXEC``).
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)  # noqa: PTH102
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    try:
        st = os.fstat(fd)
        _check_ours(path, st)
        _check_mode(path, st)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_file(
    shown: str, fd: int, kind: int = stat.S_IFREG
) -> os.stat_result:
    """*fd*'s status, if it is a file of *kind*, ours, with one link."""
    st = os.fstat(fd)
    if stat.S_IFMT(st.st_mode) != kind:
        what = "FIFO" if kind == stat.S_IFIFO else "regular file"
        raise Unsafe(f"{shown}: not a {what}")
    _check_ours(shown, st)
    if st.st_nlink > 1 and kind == stat.S_IFREG:
        raise Unsafe(f"{shown}: has {st.st_nlink} links (a hard link)")
    return st


def open_file(
    path: str,
    flags: int = os.O_RDWR | os.O_CREAT,
    *,
    dir_fd: int | None = None,
    shown: str | None = None,
) -> tuple[int, os.stat_result]:
    """
    Open (or create, mode 0600) the regular file *path* (relative to
    *dir_fd*) without following a link; checked by `check_file`. A link
    is refused naming it.
    """
    shown = shown or path
    try:
        fd = os.open(
            path, flags | NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=dir_fd
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unsafe(
                f"{shown}: a symbolic link (refused: the store never "
                "follows one)"
            ) from exc
        raise
    try:
        st = check_file(shown, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def store_files(db: str) -> None:
    """
    Check the database's directory and make (or check) the database, its
    ``-wal`` and ``-shm`` without following links, before SQLite opens
    them (SQLite would follow one).
    """
    check_parent(os.path.dirname(db) or ".")  # noqa: PTH120
    for suffix in ("", "-wal", "-shm"):
        fd, _ = open_file(db + suffix)
        os.close(fd)


def same_files(db: str) -> tuple[tuple[int, int], ...] | None:
    """
    The (device, inode) of the database, its ``-wal`` and ``-shm``; None
    if one is missing or is not a regular file of ours.
    """
    ids = []
    uid = os.geteuid()
    for suffix in ("", "-wal", "-shm"):
        try:
            st = os.lstat(db + suffix)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return None
        ids.append((st.st_dev, st.st_ino))
    return tuple(ids)
