"""The engine: the per-batch stages and the one owner of a table's in-flight state (see ARCHITECTURE.md)."""
