"""Files hdmm writes: whole or not at all, and on disk before they are used.

Every file hdmm writes (strategies, plans, releases, domains, budget ledgers, release tables, a
geography release's files) goes through here:

* :func:`write_atomically` calls a writer on a temporary file beside the target, flushes it to
  disk (``fsync``), renames it onto the target (``os.replace``, atomic on POSIX) and flushes the
  directory, so a crash leaves the old file or the new one, never half of one;
  ``replace=False`` publishes only under a name that is still free (a hard link, which fails on an
  existing name), so a file that appeared meanwhile is never replaced;
* :func:`replace_atomically` and :func:`write_new` do the same for bytes held in memory;
* :func:`sync_file` and :func:`sync_directory` flush what was written another way (a directory of
  release files before it is renamed complete);
* :func:`check_new_file` and :func:`check_new_directory` refuse an output before any work (and so
  before any noise): a directory given for a file, a file that exists, a directory that cannot be
  written.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
>>> write_new(path, b"one")
>>> write_atomically(path, lambda temporary: open(temporary, "w").write("two"))
True
>>> open(path).read()
'two'
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

__all__ = ["write_atomically", "replace_atomically", "write_new", "sync_file", "sync_directory", "check_new_file",
           "check_new_directory", "check_parent_directory"]


def sync_directory(directory: str | os.PathLike) -> None:
    """Make the entries of ``directory`` (new files, renames) durable; not possible everywhere, so failures
    are ignored."""
    try:
        descriptor = os.open(os.fspath(directory) or os.curdir, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def sync_file(path: str | os.PathLike) -> None:
    """Flush the contents of the file ``path`` to disk."""
    descriptor = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _mode(path: str) -> int:
    try:  # a file keeps its permissions; a new one gets the umask's, as open() would give it
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


def write_atomically(path: str | os.PathLike, write: Callable[[str], object], *, replace: bool = True) -> bool:
    """Call ``write(temporary)`` (a path beside ``path``), flush the file to disk and rename it to ``path``.

    ``replace`` False: publish only if ``path`` does not exist by then; returns whether the file was
    published. The temporary file is removed whatever happens.
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    mode = _mode(path)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(temporary)
        sync_file(temporary)
        os.chmod(temporary, mode)
        if replace:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False
            except OSError:  # no hard links on this file system: reserve the name, then move the file onto it
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return False
                os.replace(temporary, path)
        sync_directory(directory)
        return True
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def replace_atomically(path: str | os.PathLike, data: bytes, *, new: bool = False) -> None:
    """Write ``data`` to ``path`` atomically and durably (:func:`write_atomically`).

    ``new``: refuse (``FileExistsError``) if ``path`` exists by then.
    """
    def write(temporary: str) -> None:
        with open(temporary, "wb") as file:
            file.write(data)

    if not write_atomically(path, write, replace=not new):
        raise FileExistsError(f"{os.fspath(path)} appeared while it was being written; nothing was replaced")


def write_new(path: str | os.PathLike, data: bytes) -> None:
    """Write a new file atomically (:func:`replace_atomically`); ``FileExistsError`` if ``path`` exists."""
    replace_atomically(path, data, new=True)


def check_new_file(path: str | os.PathLike, *, overwrite: bool = True) -> str | None:
    """What is wrong with writing the file ``path`` (``None`` if nothing), a sentence beginning with the path: a
    directory of that name, an existing file when ``overwrite`` is False, an existing file that cannot be
    written, or a directory that is missing or not writable. Changes no existing file.

    >>> check_new_file(tempfile.gettempdir())  # doctest: +ELLIPSIS
    '... is a directory; give a file name'
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return f"{path} is a directory; give a file name"
    if os.path.exists(path):
        if not overwrite:
            return f"{path} exists"
        if not os.access(path, os.W_OK):
            return f"{path} cannot be written (permission denied)"
    problem = check_parent_directory(path)
    return None if problem is None else f"{path}: {problem}"


def check_new_directory(path: str | os.PathLike) -> str | None:
    """What is wrong with creating the directory ``path`` (``None`` if nothing): it exists, or its parent is
    missing or not writable."""
    path = os.fspath(path)
    if os.path.exists(path):
        return f"{path} exists"
    problem = check_parent_directory(path)
    return None if problem is None else f"{path}: {problem}"


def check_parent_directory(path: str | os.PathLike) -> str | None:
    """What is wrong with creating a file or directory at ``path`` in its parent (``None`` if nothing): the
    parent is missing, or a file cannot be created there (tries one)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"the directory {directory} does not exist; create it first"
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".hdmm-write-check-"):
            pass
    except OSError as exc:
        return f"cannot write in {directory} ({exc.strerror or exc}); choose a writable place"
    return None
