r"""An append-only file of JSON records chained by hashes: how a privacy budget is kept on disk.

A ledger file is `JSON Lines <https://jsonlines.org>`_: one JSON object per line, the first its
**header**, every later one a **record**. Each line carries a ``hash``,

.. math:: h_0 = H(\text{header}), \qquad h_i = H(h_{i-1} \,\|\, \text{record}_i),

where :math:`H` is SHA-256 of the line's canonical JSON (sorted keys, no spaces, without its own
``hash``) after the previous line's hash, or HMAC-SHA256 with a secret key when the ledger is
**keyed** (its header says so). Reading a ledger recomputes every hash, so a record deleted from
the middle, two records swapped, a record edited, or a header changed (say, a budget's total
raised) breaks the chain at that line and the file is refused.

What the chain does not do, and cannot without a secret: it does not stop someone who rewrites
the file from the edited line on and recomputes every later hash (anyone can compute SHA-256),
nor someone who removes the **last** records (what is left is a valid shorter chain). A keyed
ledger stops the first (the hashes cannot be recomputed without the key) but not the second.
To detect a truncation, keep the ledger's latest hash (:attr:`Ledger.head`, shown by
``hdmm budget show``) somewhere else and compare. File system permissions and backups remain the
real protection of a budget file; the chain makes an accident or a naive edit visible.

**Appending.** A record is written by appending one line and flushing it to disk (``fsync``)
under an exclusive advisory lock (``flock``) on the file's directory: O(1) in the size of the
ledger. Before appending, the writer reads whatever other processes appended since it last read
the file (and checks their chain), so concurrent writers all succeed, one after the other, each
seeing the others' records. (Only those are checked, and the last line it had read, which must
still be there: a line before it edited in place meanwhile is found by the next full read.) A
line without its final newline is an append that did not finish (a crash during the write):
readers ignore it, and the next writer removes it before appending. Its record never took
effect: an append returns only after its line is on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import time
from typing import Any, Callable, Iterator

from .files import replace_atomically, sync_directory, write_new

try:
    import fcntl
except ImportError:  # not POSIX (Windows): appends are not locked against other processes
    fcntl = None

__all__ = ["Ledger", "LedgerError", "chain_hash", "canonical", "LOCK_TIMEOUT"]

#: Seconds a write waits for another process's write in the same directory to finish.
LOCK_TIMEOUT = 60.0


class LedgerError(ValueError):
    """A ledger file that cannot be read as written (damaged, edited, or changed other than by appends)."""


def canonical(entry: dict[str, Any]) -> bytes:
    """A record's canonical JSON: sorted keys, no spaces, ASCII, no NaN (what its hash covers)."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def chain_hash(previous: str, entry: dict[str, Any], key: bytes | None = None) -> str:
    """The hash of ``entry`` (without its ``hash``) after the line whose hash is ``previous`` (``""`` for a header)."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    message = previous.encode() + b"\n" + canonical(body)
    if key is None:
        return "sha256:" + hashlib.sha256(message).hexdigest()
    return "hmac-sha256:" + hmac.new(key, message, hashlib.sha256).hexdigest()


class Ledger:
    """A ledger file as far as it was read or written: its path, its verified length and latest hash.

    Parameters
    ----------
    path
        The file.
    key
        The secret key of a keyed ledger (``None``: an unkeyed one).
    """

    __slots__ = ("path", "key", "offset", "head", "lines", "_last")

    def __init__(self, path: str, key: bytes | None = None) -> None:
        self.path = path
        self.key = key
        self.offset = 0  # bytes read and verified
        self.head = ""  # the hash of the last verified line
        self.lines = 0  # lines read and verified
        self._last = b""  # that line, as it is on disk (to notice a file replaced meanwhile)

    # ------------------------------------------------------------------ reading
    def parse(self, data: bytes, check: Callable[[dict[str, Any], int], None], source: str, base: int = 0) -> int:
        """Verify the complete lines of the file past ``self.offset`` and pass each, in order, to ``check``.

        ``data`` holds the file's bytes from position ``base`` on (``base <= self.offset``).
        ``check(entry, line_number)`` validates one entry (the header at line 1) and applies it;
        the chain of hashes is checked first. Returns the number of lines read. A last line
        without its newline (an unfinished append) is left unread.
        """
        end = data.rfind(b"\n") + 1
        position, count = self.offset - base, 0
        while position < end:
            stop = data.index(b"\n", position) + 1
            line, number = data[position:stop], self.lines + 1
            entry = _entry(line, number, source)
            expected = chain_hash(self.head, entry, self.key)
            if not hmac.compare_digest(str(entry.get("hash")), expected):
                raise LedgerError(
                    f"{source}: the chain of hashes breaks at line {number}: the line there does not follow the "
                    "one before it as it was written (a record was deleted, reordered or edited, or the header "
                    "changed" + (", or the key is wrong" if self.key is not None else "")
                    + "); the file cannot be trusted: restore it from a copy")
            check(entry, number)
            self.head, self._last, self.offset, self.lines = expected, line, base + stop, number
            position, count = stop, count + 1
        return count

    # ------------------------------------------------------------------ writing
    def create(self, entries: list[dict[str, Any]]) -> None:
        """Write a new ledger of ``entries`` (the header first), hashing each; the file must not exist."""
        data, head, last = self._lines(entries, "")
        directory = os.path.dirname(self.path) or os.curdir
        with locked(directory):
            write_new(self.path, data)
        sync_directory(directory)
        self.offset, self.head, self._last, self.lines = len(data), head, last, len(entries)

    def append(self, catch_up: Callable[[bytes, int], None], entries: Callable[[], list[dict[str, Any]]]) -> None:
        """Under the directory lock: read what others appended, then append ``entries()`` and flush it to disk.

        Only the end of the file is read: from the last line this ledger verified (which must
        still be there, unchanged) on. ``catch_up(data, base)`` is given those bytes and their
        position ``base`` in the file, to verify and apply the lines past :attr:`offset` (with
        :meth:`parse`); ``entries()`` then returns the records to append (without hashes), or
        raises to append nothing. An unfinished line at the end is removed first. If the write
        fails, the file is cut back to where it was.
        """
        directory = os.path.dirname(self.path) or os.curdir
        with locked(directory):
            with open(self.path, "r+b") as file:
                base = self.offset - len(self._last)
                file.seek(base)
                data = file.read()
                if data[:len(self._last)] != self._last:
                    raise LedgerError(f"{self.path} changed other than by appended records since it was read (it "
                                      "was replaced or cut); nothing was written: load it again")
                catch_up(data, base)
                complete = base + data.rfind(b"\n") + 1
                new = entries()
                if not new:
                    return
                lines, head, last = self._lines(new, self.head)
                try:
                    if complete < base + len(data):  # an append that never finished: it never took effect
                        file.truncate(complete)
                    file.seek(complete)
                    file.write(lines)
                    file.flush()
                    os.fsync(file.fileno())
                except BaseException:
                    with contextlib.suppress(OSError):
                        file.truncate(complete)
                    raise
        self.offset, self.head, self._last, self.lines = complete + len(lines), head, last, self.lines + len(new)

    def replace(self, expected: bytes, entries: list[dict[str, Any]]) -> None:
        """Rewrite the file as a new ledger of ``entries`` if it still holds ``expected`` (an upgrade in place)."""
        data, head, last = self._lines(entries, "")
        directory = os.path.dirname(self.path) or os.curdir
        with locked(directory):
            with open(self.path, "rb") as file:
                if file.read() != expected:
                    raise LedgerError(f"{self.path} changed since it was read; nothing was written: load it again")
            replace_atomically(self.path, data)
        sync_directory(directory)
        self.offset, self.head, self._last, self.lines = len(data), head, last, len(entries)

    def _lines(self, entries: list[dict[str, Any]], head: str) -> tuple[bytes, str, bytes]:
        out, line = [], b""
        for entry in entries:
            entry = {k: v for k, v in entry.items() if k != "hash"}
            head = chain_hash(head, entry, self.key)
            line = json.dumps({**entry, "hash": head}, ensure_ascii=True, allow_nan=False).encode() + b"\n"
            out.append(line)
        return b"".join(out), head, line


def _entry(line: bytes, number: int, source: str) -> dict[str, Any]:
    try:
        entry = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise LedgerError(f"{source}: line {number} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise LedgerError(f"{source}: line {number} is not valid JSON ({exc})") from None
    if not isinstance(entry, dict):
        raise LedgerError(f"{source}: line {number} must be a JSON object, got {type(entry).__name__}")
    return entry


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a ledger can hold")


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on ``directory`` for the duration of the block.

    Every ledger write takes it, so writes to ledgers in one directory happen one at a time
    across processes. The lock goes with the descriptor: a process that dies releases it. Waits
    at most ``LOCK_TIMEOUT`` seconds, then raises :class:`LedgerError`; without ``fcntl`` (not
    POSIX) it does nothing.
    """
    if fcntl is None:
        yield
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LedgerError(f"another process has been writing a budget file in {directory} for over "
                                      f"{LOCK_TIMEOUT:g} s; nothing was written: retry once it has finished") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(descriptor)
