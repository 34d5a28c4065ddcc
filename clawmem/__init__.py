"""clawmem: a SQLite search index kept in step with an agent's Markdown memory."""

__version__ = "0.1.0"
