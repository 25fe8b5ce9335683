"""What a gateway node's RocketMQ relays did with requests at store failovers, counted for the
metrics: sent again to the new leader, answered as lost (under way when the leader was lost),
or refused for want of a leader."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FailoverCounts:
    resent: int = 0
    lost: int = 0
    no_leader: int = 0

    def items(self) -> list[tuple[str, int]]:
        return [("resent", self.resent), ("lost", self.lost), ("no_leader", self.no_leader)]
