"""Meta: the small durable tables beside the index in their own RocksDB (WAL on) -- consumer
offsets, named KV tables and pop consumption's check points."""
