"""The SQLite backend of the journal: one file, WAL, the writer, the reader and the memory store."""
