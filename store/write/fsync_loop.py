"""The sync-mode flusher thread's loop (write/durable.py), compiled to run without the GIL: wait on an
eventfd, fdatasync the files the event loop named, say so on another eventfd.

Written in Python, the thread took the GIL after each of its system calls, so every fdatasync
cost the event loop's thread two or three GIL hand-offs and context switches in the middle of
its work. Compiled, the
thread never takes the GIL between ``run()`` and ``stop()``; interpreted (``TIDEMQ_PURE_PYTHON``)
the same file does the same with ``os`` calls.
"""

from __future__ import annotations

import os

import cython

if cython.compiled:
    from cython.cimports.libc.errno import EINTR, errno
    from cython.cimports.posix.unistd import fdatasync, read, write

MAX_FILES = 16  # files one request can name (segments between the durable position and the end)


@cython.cclass
class FsyncLoop:
    """``run()`` on the thread; ``request(fds)`` from the event loop's thread once the previous
    request was answered on ``done`` (an eventfd); ``error``: the errno of the answered
    request's failed fdatasync, else 0."""

    _fds = cython.declare(cython.int[16])
    _count = cython.declare(cython.int)
    _error = cython.declare(cython.int)
    _stopping = cython.declare(cython.bint)
    ask = cython.declare(cython.int, visibility="readonly")
    done = cython.declare(cython.int, visibility="readonly")

    def __init__(self, ask: cython.int, done: cython.int) -> None:
        self.ask = ask
        self.done = done
        self._count = 0
        self._error = 0
        self._stopping = False
        if not cython.compiled:
            self._fds = [0] * MAX_FILES

    @property
    def error(self) -> int:
        return self._error

    def request(self, fds: list[int]) -> None:
        """fdatasync ``fds`` (at most MAX_FILES), then write to ``done``."""
        i: cython.int
        if len(fds) > MAX_FILES:
            raise ValueError(f"at most {MAX_FILES} files a request, not {len(fds)}")
        for i in range(len(fds)):
            self._fds[i] = fds[i]
        self._count = len(fds)  # (the eventfd write below orders these before the thread reads them)
        os.eventfd_write(self.ask, 1)

    def stop(self) -> None:
        self._stopping = True
        os.eventfd_write(self.ask, 1)

    def run(self) -> None:
        if cython.compiled:
            with cython.nogil:
                self._serve()
        else:
            while True:
                os.eventfd_read(self.ask)
                if self._stopping:
                    return
                self._error = 0
                for fd in self._fds[: self._count]:
                    try:
                        os.fdatasync(fd)
                    except OSError as exc:
                        self._error = exc.errno or 5
                        break
                os.eventfd_write(self.done, 1)

    @cython.cfunc
    @cython.nogil
    @cython.exceptval(check=False)
    def _serve(self) -> cython.void:
        counter: cython.ulonglong = 0
        one: cython.ulonglong = 1
        i: cython.int
        while True:
            if read(self.ask, cython.address(counter), 8) != 8:
                if errno == EINTR:
                    continue
                self._error = errno  # (the eventfd broke: nothing more can be asked)
                return
            if self._stopping:
                return
            self._error = 0
            for i in range(self._count):
                if fdatasync(self._fds[i]) != 0:
                    self._error = errno
                    break
            while write(self.done, cython.address(one), 8) != 8 and errno == EINTR:
                pass
