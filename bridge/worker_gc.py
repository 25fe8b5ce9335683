"""Keeps what a Spark Python worker has imported out of the garbage collector's full passes.

PySpark's worker daemon runs ``gc.collect()`` after every task of a reused worker, and a full
pass walks every object the process holds: mostly the modules it imported (pyspark, pyarrow,
numpy, this source). Moved to the collector's permanent generation once, when the source first
reads in that process, they are no longer walked task after task.
"""

from __future__ import annotations

import functools
import gc


@functools.cache
def freeze_imports() -> None:
    """Freeze the objects alive now, once per process (a later call does nothing, and costs
    nothing: ``gc.get_freeze_count`` would walk every frozen object to count them)."""
    gc.freeze()
