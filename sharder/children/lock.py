"""One writer per output tree: an advisory lock file beside ``--out``.

Pipeline position: ``federation.master.pipeline.render`` holds :func:`output_lock` from reading
the previous ``assignment.json`` to the swap of the new tree, so two renders into one
directory cannot both read the same previous state and then overwrite each other's
staging or swap. The lock is ``<parent>/.<name>.lock`` (the output directory itself is
replaced by the swap, so it cannot hold the lock) taken with ``flock``: the kernel drops
it when the holder dies, so a crashed run never leaves the tree locked. The file is
removed on release; a waiter that locked a file already unlinked notices (the inode at
the path changed) and tries again, so two runs never both believe they hold it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sharder.kernel.errors import LockedError


def lock_path(out_dir: str | Path) -> Path:
    out = Path(out_dir).absolute()
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_lock(out_dir: str | Path, *, timeout: float = 0.0, poll: float = 0.1) -> Iterator[Path]:
    """Hold the lock for ``out_dir``; wait up to ``timeout`` seconds, then ``LockedError``."""
    path = lock_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise LockedError(
                    f"{Path(out_dir)}: another gpufed run is writing this output{_holder(path)}"
                    f" (lock file {path}); wait for it to finish and run again"
                ) from None
            time.sleep(poll)
            continue
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file between our open and our lock
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)  # closing releases the flock


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _holder(path: Path) -> str:
    try:
        pid = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""
