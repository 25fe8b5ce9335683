"""Differential tests of the flusher thread's loop (store/write/fsync_loop.py): the C extension (which
runs without the GIL) and the interpreted reference answer the same requests the same way:
fdatasync of the named files, the errno of a failed one, a refused oversize request, and a
thread that ends on ``stop()``."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from types import ModuleType

import pytest

from .native_support import compiled, interpreted, outcome

MODULE = "store.write.fsync_loop"
NOT_OPEN = 1 << 20


def builds() -> list[ModuleType]:
    return [compiled(MODULE), interpreted(MODULE)]


def answers(module: ModuleType, requests: list[list[int]]) -> list[int]:
    ask = os.eventfd(0, os.EFD_CLOEXEC)
    done = os.eventfd(0, os.EFD_CLOEXEC)
    loop = module.FsyncLoop(ask, done)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    errors = []
    try:
        for fds in requests:
            loop.request(fds)
            os.eventfd_read(done)  # (blocks until the thread answers)
            errors.append(loop.error)
    finally:
        loop.stop()
        thread.join(10)
        os.close(ask)
        os.close(done)
    assert not thread.is_alive()
    return errors


def test_both_builds_sync_files_and_report_a_failure_by_its_errno(tmp_path: Path) -> None:
    fds = []
    for i in range(3):
        fd = os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_RDWR)
        os.write(fd, b"x" * 100)
        fds.append(fd)
    requests = [[fds[0]], fds, [], [NOT_OPEN], [fds[1], NOT_OPEN, fds[2]], [fds[2]]]
    try:
        got = [answers(module, requests) for module in builds()]
    finally:
        for fd in fds:
            os.close(fd)
    assert got[0] == got[1] == [0, 0, 0, errno.EBADF, errno.EBADF, 0]


@pytest.mark.parametrize("build", ["compiled", "interpreted"])
def test_a_request_naming_too_many_files_is_refused(build: str) -> None:
    module = compiled(MODULE) if build == "compiled" else interpreted(MODULE)
    loop = module.FsyncLoop(-1, -1)
    too_many = [0] * (module.MAX_FILES + 1)
    assert outcome(loop.request, too_many) == (
        "error", (ValueError, f"at most {module.MAX_FILES} files a request, not {module.MAX_FILES + 1}"))
