"""Held messages: written to the commitlog once and indexed into their queues later (timer and
transaction half messages) -- the control records and hold keys (``codec``) and the store's
operations on them (``held_messages``)."""
