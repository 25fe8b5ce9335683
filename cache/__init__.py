"""Per-queue in-memory window of recent messages shared by all sessions of a node (high fan-out reads)."""
