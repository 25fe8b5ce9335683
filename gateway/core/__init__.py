"""The delivery core every protocol reads through: a reader's cursor over a queue (cursor.py)
and competing consumers of one queue with their durable group offset (group.py)."""
