"""Opening files in a directory other users may share: the rules every open of the file backend follows.

A ``flock`` needs only read access, so whoever may open the lock file may
hold the lock forever, and whoever may rename files in its directory may
move it away while it is held. Guarantees of :func:`open_checked`:

* never through a symbolic link at the path (``O_NOFOLLOW``), never waiting
  for a FIFO's other end (``O_NONBLOCK``);
* what was opened is a regular file owned by this user (or, with
  ``mode=0o660``, by a user of one of our groups, and no wider than
  ``mode``), checked on the path first and again on the open descriptor;
  anything else is a clear :class:`~aioelect.ElectionError` naming the path
  and the problem, never a wait and never a retry;
* a file we create gets exactly ``mode``, whatever the umask.

:func:`directory_problem` refuses a directory every user may write to
without the sticky bit, one its group may write to without the sticky bit
unless ``mode=0o660`` trusts the group, and one owned by another user than ours or root
(with ``mode=0o660``: unless it belongs to one of our groups). Every
function here looks up paths or the user database: call them off the event
loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat

from ...core._errors import ElectionError, PermanentBackendError
from ...core._log import ElectionLog

__all__ = [
    "MODES",
    "PERMANENT_ERRNOS",
    "at_path",
    "close_fd",
    "directory_problem",
    "open_checked",
    "read_bounded",
    "resolve",
    "same",
    "same_file",
]

#: The modes ``mode=`` accepts: the owner reads and writes, and so may a group. Nothing between: read
#: access alone is enough to hold a ``flock``. Other users never get access (any of them could hold the
#: lock forever).
MODES = (0o600, 0o660)

#: Errors that no retry can fix: the directory or file is missing, not ours, or read-only.
PERMANENT_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EROFS,
    errno.ELOOP,
    errno.ENXIO,
    errno.ENODEV,
}

#: Every open: never through a symbolic link at the path, never waiting for a FIFO's other end.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def close_fd(fd: int) -> None:
    """Close ``fd``, ignoring an error: it is being given up either way."""
    with contextlib.suppress(OSError):
        os.close(fd)


def at_path(path: str) -> os.stat_result | None:
    """What ``path`` itself names (a symbolic link is not followed), None if nothing; a path lookup."""
    try:
        return os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None


def same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def same_file(fd: int, path: str) -> bool:
    """True if ``path`` still names the file open on ``fd`` (not a symbolic link to it)."""
    found = at_path(path)
    return found is not None and same(found, os.fstat(fd))


def _user(uid: int) -> str:
    """``name (uid N)`` for messages."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    )
    return next((name for test, name in kinds if test(mode)), "of an unknown type")


def directory_problem(directory: str, mode: int) -> str | None:
    """Why ``directory`` cannot hold an election's files safely, or None.

    Whoever may rename files in it can move the lock file away while it is
    held, and candidates locking a new one would lead beside the old leader
    until its next check. Refused therefore: a directory every user may write
    to without the sticky bit (with it, as /tmp has, others may only add
    files, which the owner checks refuse), one its group may write to
    without the sticky bit unless ``mode`` shares the election with a group
    (``0o660``), and a directory owned by another
    user than this process's or root, unless ``mode`` shares the election
    with a group and the directory belongs to one of our groups.
    """
    st = os.stat(directory)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return (
            f"directory {directory} may be written by every user and is not sticky: any of them could replace "
            "the lock file and let two candidates lead at once; use a directory of your own, or remove write "
            "access for others (chmod o-w), or set the sticky bit as /tmp has (chmod +t)"
        )
    if st.st_mode & stat.S_IWGRP and not st.st_mode & stat.S_ISVTX and not mode & 0o070:
        return (
            f"directory {directory} may be written by its group and is not sticky: any member could rename the "
            f"lock file away while it is held and let two candidates lead at once, but mode={oct(mode)} trusts "
            "no group; remove write access for the group (chmod g-w), set the sticky bit (chmod +t), or, if "
            "the group's users are candidates of this election, give every candidate mode=0o660"
        )
    if st.st_uid not in (os.geteuid(), 0):
        shared = mode & 0o070 and st.st_gid in {os.getegid(), *os.getgroups()}
        if not shared:
            return (
                f"directory {directory} is owned by {_user(st.st_uid)}, not by this process's user "
                f"{_user(os.geteuid())} or root: its owner could replace the lock file and let two candidates "
                "lead at once; use a directory of your own (for a group of users: one of that group, with "
                "mode=0o660)"
            )
    return None


def read_bounded(fd: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``fd`` from its start, None if there are more (st_size is not trusted)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.pread(fd, limit + 1 - size, size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None


def open_checked(path: str, what: str, mode: int, *, create: bool, write: bool, log: ElectionLog | None = None) -> int:
    """Open ``path``, a regular file this process may trust; ElectionError otherwise.

    Never follows a symbolic link at ``path`` and never waits for a FIFO's
    other end: what is there is looked at first, and checked again on the
    open descriptor (it may have been swapped in between). With ``log``, a
    file of ours whose permissions differ from ``mode`` is set to ``mode``
    (with a warning there if it let more users in). FileNotFoundError when
    ``create`` is False and nothing is there.
    """
    before = at_path(path)
    if before is not None:
        _check(before, path, what, mode)
    elif not create:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    flags = (os.O_RDWR if write else os.O_RDONLY) | _OPEN_FLAGS | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, mode)
    except FileNotFoundError:
        if create:  # the directory is gone
            raise PermanentBackendError(f"cannot open {what} {path}: {os.strerror(errno.ENOENT)}") from None
        raise
    except OSError as exc:
        raise _open_error(path, what, exc) from None
    try:
        st = os.fstat(fd)
        _check(st, path, what, mode)
        bits = stat.S_IMODE(st.st_mode)
        if log is not None and st.st_uid == os.geteuid() and bits != mode:
            os.fchmod(fd, mode)  # also what a umask removed from a file we just created
            if bits & ~mode:
                log.warning(
                    "%s %s had mode %s, wider than mode=%s: set to %s, so that other users cannot open it "
                    "and hold the lock",
                    what,
                    path,
                    oct(bits),
                    oct(mode),
                    oct(mode),
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(st: os.stat_result, path: str, what: str, mode: int) -> None:
    """ElectionError unless ``st`` is a regular file of ours, or of our group when ``mode`` shares it."""
    if not stat.S_ISREG(st.st_mode):
        hint = (
            "aioelect never follows one there (it could point anywhere)"
            if stat.S_ISLNK(st.st_mode)
            else "not a regular file"
        )
        raise PermanentBackendError(f"{what} {path} is {_kind(st.st_mode)}, {hint}: remove it, or choose another path")
    me = os.geteuid()
    if st.st_uid == me:
        return
    bits = stat.S_IMODE(st.st_mode)
    owner = f"{what} {path} is owned by {_user(st.st_uid)}, not by this process's user {_user(me)}"
    if not mode & 0o070:
        raise PermanentBackendError(
            f"{owner}: another user may have planted it. Remove it if it is not yours; for an election shared "
            "by the users of a group, give every candidate mode=0o660 and a directory of that group"
        )
    if st.st_gid not in {os.getegid(), *os.getgroups()}:
        raise PermanentBackendError(f"{owner}, and its group (gid {st.st_gid}) is not one of this process's groups")
    if bits & ~mode:
        raise PermanentBackendError(f"{owner}, with mode {oct(bits)}: wider than mode={oct(mode)}")


def _open_error(path: str, what: str, exc: OSError) -> OSError | ElectionError:
    """The error to raise for a failed open: ElectionError if no retry can fix it."""
    if exc.errno == errno.ELOOP:
        return PermanentBackendError(
            f"{what} {path} is a symbolic link, and aioelect never follows one there (it could point "
            "anywhere): remove it, or choose another path"
        )
    if exc.errno in (errno.EISDIR, errno.ENXIO, errno.ENODEV):
        return PermanentBackendError(f"{what} {path} is not a regular file ({exc.strerror}): remove it")
    if exc.errno in (errno.EACCES, errno.EPERM):
        found = at_path(path)
        who = f" (owned by {_user(found.st_uid)}, mode {oct(stat.S_IMODE(found.st_mode))})" if found is not None else ""
        return PermanentBackendError(f"cannot open {what} {path}: {exc.strerror}{who}")
    if exc.errno in PERMANENT_ERRNOS:
        return PermanentBackendError(f"cannot open {what} {path}: {exc.strerror}")
    return exc


def resolve(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The absolute lock file path and its directory; ValueError for what cannot work. Looks at the directory."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise ValueError(f"path must be a file path, not {path!r}") from None
    if not isinstance(text, str) or not text:
        raise ValueError("path must be a non-empty file path")
    full = os.path.abspath(os.path.expanduser(text))
    directory = os.path.dirname(full)
    try:
        is_dir = stat.S_ISDIR(os.stat(directory).st_mode)
    except FileNotFoundError:
        raise ValueError(f"directory {directory} of lock file {full} does not exist") from None
    except NotADirectoryError:
        is_dir = False
    except PermissionError:
        raise ValueError(f"directory {directory} of lock file {full}: permission denied") from None
    if not is_dir:
        raise ValueError(f"{directory} (the lock file's directory) is not a directory")
    if os.path.isdir(full):
        raise ValueError(f"{full} is a directory; path must name the lock file")
    return full, directory
