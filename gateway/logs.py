"""Structured key=value logging for the whole process.

Log calls read ``log.info("store opened data_dir=%s end=%d", ...)``: the words before the
first ``key=`` become ``msg="..."``, the pairs follow as they are.
"""

from __future__ import annotations

import logging
import sys
import time


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        words = text.split(" ")
        cut = next((i for i, w in enumerate(words) if "=" in w and not w.startswith("=")), len(words))
        msg = " ".join(words[:cut]).replace('"', "'")
        pairs = " ".join(words[cut:])
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f'ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} logger={record.name} msg="{msg}"'
        if pairs:
            line += " " + pairs
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
