"""Replication of the store (a leader and followers): the epoch history of the log, the link's
frames, the follower's and the leader's sides without I/O, and the link over asyncio streams.
Who leads is decided outside the store (gateway/cluster/, in etcd); the store is told."""
