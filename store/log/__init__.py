"""The commitlog and its records: segment files, the record codec (one message <-> bytes and many
records at once as columns), message ids by position, and recovery of the log at open."""
