"""A leader's side of replication, without I/O of its own: the answer to a follower's HELLO,
the bytes to send it next, and the confirmed position -- the end of what enough replicas hold.

The confirmed position (Kafka's high watermark, RocketMQ's confirm offset) is what every
in-sync replica holds, while at least ``min_insync`` replicas are in sync.
"""

from __future__ import annotations

import hmac

from ..log.commitlog import CommitLog
from .epochs import EpochHistory, common_end
from .wire import Data, Hello, Refuse, Welcome


class LeaderLog:
    def __init__(self, commitlog: CommitLog, epochs: EpochHistory, token: str = "") -> None:
        self._log = commitlog
        self.epochs = epochs
        self._token = token

    @property
    def epoch(self) -> int:
        return self.epochs.current

    def welcome(self, hello: Hello) -> Welcome | Refuse:
        """Where the follower's log stops agreeing with this one, or why it may not follow."""
        if self._token and not hmac.compare_digest(hello.token.encode(), self._token.encode()):
            return Refuse("wrong replication token")
        if hello.segment_size != self._log.segment_size:
            return Refuse(f"segment size {hello.segment_size} differs from the leader's {self._log.segment_size}")
        if hello.epochs and hello.epochs[-1][0] > self.epoch:
            return Refuse(f"the follower has seen epoch {hello.epochs[-1][0]}, newer than this leader's {self.epoch}")
        agreed = common_end(self.epochs.entries, self._log.end_position, hello.epochs, hello.log_end)
        return Welcome(self.epoch, agreed, self._log.min_position, list(self.epochs.entries))

    def needs_seed(self, welcome: Welcome) -> bool:
        """The follower agrees with this log only before its oldest position: it is seeded
        (replica/seed.py) rather than streamed to."""
        return welcome.agreed_end < self._log.min_position

    def next_data(self, position: int, confirmed: int, max_bytes: int) -> Data:
        """The bytes from ``position`` on (at most ``max_bytes``, within one segment); empty at the
        end of the log (a heartbeat carrying ``confirmed``)."""
        log_ = self._log
        end = log_.end_position
        size = log_.segment_size
        while position < end:
            seg = log_.segment_of(position)
            if seg is not None and position < seg.start + seg.length:
                payload = log_.read(position, min(max_bytes, seg.start + seg.length - position, end - position))
                return Data(self.epoch, position, confirmed, bytes(payload))
            position = position - position % size + size  # the rest of that segment is unused
        return Data(self.epoch, min(position, end), confirmed, b"")


def confirmed_position(own: int, followers: dict[str, int], in_sync: frozenset[str], min_insync: int,
                       joining: frozenset[str] = frozenset()) -> tuple[int, bool]:
    """What every in-sync replica holds -- the lowest position among the leader (``own``), its
    in-sync followers and those being added to the set (a follower not heard from counts as 0)
    -- and whether at least ``min_insync`` replicas, the leader included, are in sync (the ones
    being added not yet). Any in-sync replica may be the next leader, so all of them must hold
    what is shown to readers (Kafka's high watermark); a write is acknowledged only when enough
    of them do (Kafka's min.insync.replicas). A follower counts from the moment the request to
    add it is sent: once added, it may lead (Kafka's maximal in-sync set)."""
    members = in_sync | joining
    return min([own, *(followers.get(node, 0) for node in members)]), 1 + len(in_sync) >= min_insync
