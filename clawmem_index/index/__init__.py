"""The index stores behind one interface: SQLite (`store` with its keyword index, vector index and cells, parked
vectors, schema and migrations) and PostgreSQL (`pg`) side by side, the search filter both speak, and `backends`,
which picks the store a workspace's settings name.

May use: `embeddings` (for its identity types), `sources`, `text` and the base.
"""
