"""The consume-queue index and dispatch: commitlog records -> queue entries and key-index rows in
one RocksDB WriteBatch, each queue's first offset, and notify events after each dispatch."""
