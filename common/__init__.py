"""Small helpers with no knowledge of any layer, that every layer may use: Java's string hash,
the wall clock in milliseconds, stopping background tasks. Imports nothing of the project."""
