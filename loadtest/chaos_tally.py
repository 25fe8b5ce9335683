"""The count of one fault's run for one protocol: which publishes were acknowledged and when,
which deliveries reached the consumer (and whether a repeat was flagged redelivered/DUP), and
from these the figures of a chaos line: acked, received, lost, duplicated, unavailable_s."""

from __future__ import annotations

import statistics
import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Figures:
    acked: int
    received: int  # distinct acknowledged messages the consumer got
    lost: int  # acknowledged, never received
    duplicated: int  # deliveries beyond the first of a message
    unflagged_duplicates: int  # of those, repeats without the redelivered/DUP flag ...
    unexplained_duplicates: int  # ... of a message its publisher sent only once
    unavailable_s: float | None  # the longest silence of acknowledgements after the fault; None: none came

    def line(self, fault: str, protocol: str) -> str:
        unavailable = "never" if self.unavailable_s is None else f"{self.unavailable_s:.2f}"
        return (f"chaos fault={fault} protocol={protocol} acked={self.acked} received={self.received} "
                f"lost={self.lost} duplicated={self.duplicated} unavailable_s={unavailable}")


class Tally:
    """Publishers and consumers of one protocol record here, from any thread; ``figures``
    reads it once publishing stopped and the consumer drained."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: Counter[str] = Counter()  # publish attempts per message id
        self.acked_at: dict[str, float] = {}  # first acknowledgement of each message id
        self.deliveries: Counter[str] = Counter()
        self.unflagged_repeats: Counter[str] = Counter()

    def on_sent(self, message_id: str) -> None:
        with self._lock:
            self.sent[message_id] += 1

    def on_acked(self, message_id: str, at: float) -> None:
        with self._lock:
            self.acked_at.setdefault(message_id, at)

    def on_delivered(self, message_id: str, flagged: bool) -> None:
        """One delivery; ``flagged``: the broker marked it redelivered (AMQP) or DUP (MQTT)."""
        with self._lock:
            self.deliveries[message_id] += 1
            if self.deliveries[message_id] > 1 and not flagged:
                self.unflagged_repeats[message_id] += 1

    def missing(self) -> set[str]:
        """Acknowledged messages not delivered yet (what a drain waits for)."""
        with self._lock:
            return {m for m in self.acked_at if m not in self.deliveries}

    def first_ack_after(self, moment: float) -> float | None:
        with self._lock:
            later = [at for at in self.acked_at.values() if at >= moment]
        return min(later) if later else None

    def longest_silence(self, fault_at: float, load_end: float) -> float | None:
        """The longest time without a first acknowledgement between the fault and the end of
        the load (an acknowledgement in flight at the fault does not hide the outage after
        it); None when nothing was acknowledged after the fault."""
        with self._lock:
            moments = sorted(at for at in self.acked_at.values() if fault_at <= at <= load_end)
        if not moments:
            return None
        edges = [fault_at, *moments, load_end]
        return max(later - earlier for earlier, later in zip(edges, edges[1:]))

    def figures(self, fault_at: float, load_end: float) -> Figures:
        with self._lock:
            acked = set(self.acked_at)
            received = sum(1 for m in acked if m in self.deliveries)
            duplicated = sum(count - 1 for count in self.deliveries.values() if count > 1)
            unflagged = sum(self.unflagged_repeats.values())
            unexplained = sum(n for m, n in self.unflagged_repeats.items() if self.sent[m] <= 1)
        return Figures(len(acked), received, len(acked) - received, duplicated, unflagged, unexplained,
                       self.longest_silence(fault_at, load_end))


def summary_lines(runs: list[tuple[str, str, Figures]]) -> list[str]:
    """One line per fault and protocol over every round of it (fault, protocol, figures): the
    sums, and the median and worst unavailability (``never`` when a round had no acknowledgement
    after its fault)."""
    grouped: dict[tuple[str, str], list[Figures]] = {}
    for fault, protocol, figures in runs:
        grouped.setdefault((fault, protocol), []).append(figures)
    lines = []
    for (fault, protocol), rounds in grouped.items():
        waits = [f.unavailable_s for f in rounds]
        if any(wait is None for wait in waits):
            median = worst = "never"
        else:
            median = f"{statistics.median(waits):.2f}"  # type: ignore[type-var]
            worst = f"{max(waits):.2f}"  # type: ignore[type-var]
        lines.append(f"# summary fault={fault} protocol={protocol} rounds={len(rounds)} "
                     f"acked={sum(f.acked for f in rounds)} lost={sum(f.lost for f in rounds)} "
                     f"duplicated={sum(f.duplicated for f in rounds)} "
                     f"unflagged_duplicates={sum(f.unflagged_duplicates for f in rounds)} "
                     f"unavailable_s_median={median} unavailable_s_max={worst}")
    return lines
