"""The engine: one workspace's index as a whole (`core.Engine`): sync by hash, atomic rebuilds, vectors and
batch backfills, queries. What the CLI and the daemon call; it knows nothing of sockets or terminals.

May use: `search`, `index`, `embeddings`, `sources`, `text` and the base.
"""
