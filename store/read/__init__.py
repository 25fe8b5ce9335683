"""Reading: index entries back to stored messages, write-through to readers at a queue's end, and
the bulk readers' entry points -- a data directory read-only (``readonly``) and as Arrow columns
(``columns``), the two modules other layers may import besides the store's front door."""
