"""Search: candidate pools, fusion and ranking (`ranking`), the answers cache, the passive-injection context block.

May use: `index`, `embeddings`, `sources`, `text` and the base. Pure stages over plain data where it can be.
"""
