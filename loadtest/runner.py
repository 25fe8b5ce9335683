"""The one runner of the benchmarks: the command line each entry point starts from (its docstring's
first paragraph as the description, ``--quick`` and ``--out`` where it takes them) and its result
lines, each printed as it comes and appended to the ``--out`` file."""

from __future__ import annotations

import argparse
from types import TracebackType
from typing import TextIO


def parser(doc: str | None, *, quick: str | None = None, out: bool = True,
           whole_doc: bool = False) -> argparse.ArgumentParser:
    """A benchmark's argument parser; ``quick``: the help of its ``--quick`` (None: it has none);
    ``whole_doc``: the help shows the whole docstring, as written."""
    if whole_doc:
        made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        made = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if quick is not None:
        made.add_argument("--quick", action="store_true", help=quick)
    if out:
        made.add_argument("--out", help="also append the lines to this file")
    return made


class Lines:
    """A run's result lines: printed at once, and appended (flushed) to ``path`` when given."""

    def __init__(self, path: str | None = None) -> None:
        self._file: TextIO | None = open(path, "a") if path else None

    def emit(self, line: str) -> None:
        print(line, flush=True)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
