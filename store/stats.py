"""Latency histograms the store keeps for the gateway's metrics endpoint: counts per upper
bound and their sum, what a Prometheus histogram exports (the store, a library, does not
depend on prometheus-client; the gateway's collector turns these into metric families)."""

from __future__ import annotations

from bisect import bisect_left

# seconds: 50 us ... 10 s, roughly x2.5 apart (a put in sync mode waits for fdatasync: ms)
DEFAULT_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                  1.0, 2.5, 10.0)


class LatencyHistogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = DEFAULT_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (inf, count)."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out
