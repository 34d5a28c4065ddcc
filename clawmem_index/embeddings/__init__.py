"""Embedding providers behind one protocol (`base.EmbeddingProvider`)."""
