"""Retention and reclaim: whole commitlog segments cut by age and size, a queue's own limits on
top, idle light queues removed from the index, and the per-queue policy the store asks for."""
