"""Embedding providers behind one protocol (`base.EmbeddingProvider`): OpenAI, Gemini, Voyage, the local GGUF model
(in process or isolated in a child), batch jobs, retries, request planning, and `fake` for tests.

May use: `text` and the base only. Provider SDKs and llama.cpp are imported on first use, never at import.
"""
