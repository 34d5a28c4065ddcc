"""The shared index in PostgreSQL with pgvector: its schema and migrations (`schema`), its store (`store`, the
same interface as clawmem_index.index.store's SQLite one) and the parts the store composes (`connection`,
`generations`, `live`, `keyword_search`, `vectors`, `embedding_cache`), and the keyword terms it keeps (`terms`).
Needs the `postgres` extra (psycopg); imported only when `index_backend = "postgres"`. May use what the SQLite
store may (the index's filters and row shapes, `embeddings`, `text`, the base), never the SQLite store itself."""
