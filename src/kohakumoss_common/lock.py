"""One process per folder: an advisory lock on `<folder>/.lock`, held while the process works in it.

The operating system releases the lock when its process ends, however it ends (kill -9 included), so a
lock is never stale; the file itself stays (removing it would race a process that just opened it). It
holds the owner's pid, for the message of the process refused. POSIX: fcntl.flock; Windows:
msvcrt.locking on the file's first byte.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import KohakuMossError

LOCK_NAME = ".lock"


class FolderInUse(KohakuMossError):
    """Another process holds the folder's lock."""

    def __init__(self, folder: Path, pid: str):
        self.folder, self.pid = folder, pid
        owner = f"process {pid}" if pid else "another process"
        super().__init__(f"{folder}: in use by {owner} (its .lock is held); wait for it to end")


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class FolderLock:
    """`with FolderLock(folder):` the block runs as the folder's only user, else FolderInUse (naming the
    folder and the pid holding it) before any work."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            try:
                pid = os.read(fd, 32).decode(errors="replace").strip()
            except OSError:  # Windows: the locked byte cannot be read
                pid = ""
            finally:
                os.close(fd)
            raise FolderInUse(self.folder, pid)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """`with exclusive(path):` waits for, then holds, an advisory lock on the file `path` (made if missing):
    processes that update one shared file (several ranks' tuning tables) take turns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # Windows: LK_LOCK retries for ~10 s, then raises
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
