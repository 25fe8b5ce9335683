"""Pages of store queue names for the listings (``/data/queues``, ``/admin/queues``): the names
under a prefix, after a cursor, those the caller may not see left out *before* the page is cut,
so that a limit counts only what is shown and the next page starts where this one stopped.

A page scans at most ``MAX_SCAN`` names (keys only), so a caller who may see few of many queues
costs a bounded scan per request: its page may then hold fewer rows than asked for, and its
``next_after`` says where to go on. ``next_after`` is None only when the listing is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

MAX_SCAN = 10_000  # names looked at per page


@dataclass(slots=True)
class QueuePage:
    names: list[str]
    next_after: str | None  # the cursor of the next page; None: nothing more to list


def queue_page(iter_names: Callable[[str, str], Iterator[str]], prefix: str, after: str, limit: int,
               visible: Callable[[str], bool]) -> QueuePage:
    """Up to ``limit`` names under ``prefix`` past ``after`` for which ``visible`` holds."""
    names: list[str] = []
    scanned = 0
    last = after
    for name in iter_names(prefix, after):
        if scanned >= MAX_SCAN:
            return QueuePage(names, last)  # the scan's budget is spent: more may follow
        scanned += 1
        if not visible(name):
            last = name
            continue
        if len(names) == limit:
            return QueuePage(names, names[-1] if names else last)  # one more to show: cut here
        names.append(name)
        last = name
    return QueuePage(names, None)
