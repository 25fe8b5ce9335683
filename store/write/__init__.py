"""Writing: group commit (every waiting put in one append and one index batch), the per-message
bookkeeping it needs, and sync-mode durability (the fdatasync thread and its acknowledgements)."""
