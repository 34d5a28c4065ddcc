"""The shared index's schema in PostgreSQL, its migrations, and who may read and write which workspace.

Every row but the embedding cache belongs to a workspace and a generation. A workspace's live
generation is named in `cm_workspaces`; a rebuild writes the next one beside it and switches in
one transaction, so readers see the old rows or the new, never a mix. The cache is keyed by the
text's hash and the model alone: one text is embedded once for the whole fleet.

Isolation is the database's: row-level security on every workspace table. The tables' owner (who
ran the migrations: a single-user setup, or an administrator) sees every workspace; any other role
sees the workspaces `cm_access` grants to a role it is a member of, and writes only those granted
`writable`. `grant_workspace` is how an owner hands a role a workspace.

The chunks are partitioned by workspace: each workspace's rows, keyword index (GIN) and vector
indexes (HNSW) are its own, so a query or a write costs the same whether the database holds ten
workspaces or ten thousand.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Protocol

import psycopg

from clawmem_index.errors import IndexUnavailable
from clawmem_index.index.pg.grants import WORKSPACE_TABLES, grant_workspace

__all__ = ["MIGRATIONS", "WORKSPACE_TABLES", "Session", "grant_workspace", "migrate"]

_LOCK = 0x636C61776D656D  # advisory lock key for migrations ("clawmem")

MIGRATIONS: list[tuple[str, str]] = [
    ("0001_initial", """
        CREATE EXTENSION IF NOT EXISTS vector;
        CREATE TABLE cm_workspaces(
            workspace text PRIMARY KEY,
            live_gen bigint NOT NULL DEFAULT 0,
            next_gen bigint NOT NULL DEFAULT 1,
            version bigint NOT NULL DEFAULT 0,
            created_at double precision NOT NULL
        );
        CREATE TABLE cm_meta(
            workspace text NOT NULL, gen bigint NOT NULL, key text NOT NULL, value text NOT NULL,
            PRIMARY KEY(workspace, gen, key)
        );
        CREATE TABLE cm_files(
            workspace text NOT NULL, gen bigint NOT NULL, path text NOT NULL,
            source text NOT NULL DEFAULT 'memory', hash text NOT NULL, mtime bigint NOT NULL, size bigint NOT NULL,
            state text NOT NULL DEFAULT '', indexed_at double precision NOT NULL,
            PRIMARY KEY(workspace, gen, path)
        );
        CREATE TABLE cm_chunks(
            seq bigserial PRIMARY KEY,
            workspace text NOT NULL, gen bigint NOT NULL,
            id text NOT NULL, path text NOT NULL, source text NOT NULL DEFAULT 'memory',
            start_line integer NOT NULL, end_line integer NOT NULL,
            hash text NOT NULL, model text NOT NULL DEFAULT '', text text NOT NULL, date text,
            embedded boolean NOT NULL DEFAULT false, updated_at double precision NOT NULL,
            terms text[] NOT NULL, counts integer[] NOT NULL, length integer NOT NULL,
            dims integer, embedding vector,
            UNIQUE(workspace, gen, id)
        );
        CREATE INDEX cm_chunks_path ON cm_chunks(workspace, gen, path, start_line);
        CREATE INDEX cm_chunks_pending ON cm_chunks(workspace, gen, seq) WHERE NOT embedded;
        CREATE INDEX cm_chunks_hash ON cm_chunks(hash);
        CREATE INDEX cm_chunks_terms ON cm_chunks USING gin(terms);
        CREATE TABLE cm_terms(
            workspace text NOT NULL, gen bigint NOT NULL, term text NOT NULL, df integer NOT NULL,
            PRIMARY KEY(workspace, gen, term)
        );
        CREATE INDEX cm_terms_prefix ON cm_terms(workspace, gen, term text_pattern_ops);
        CREATE TABLE cm_stats(
            workspace text NOT NULL, gen bigint NOT NULL, chunks bigint NOT NULL DEFAULT 0,
            tokens bigint NOT NULL DEFAULT 0,
            PRIMARY KEY(workspace, gen)
        );
        CREATE TABLE cm_jobs(
            workspace text NOT NULL, id text NOT NULL, provider text NOT NULL, model text NOT NULL,
            provider_key text NOT NULL, hashes text NOT NULL, submitted_at double precision NOT NULL,
            polled_at double precision NOT NULL, state text NOT NULL DEFAULT 'running', detail text NOT NULL DEFAULT '',
            PRIMARY KEY(workspace, id)
        );
        CREATE TABLE cm_embedding_cache(
            provider text NOT NULL, model text NOT NULL, provider_key text NOT NULL, hash text NOT NULL,
            embedding bytea NOT NULL, dims integer NOT NULL, updated_at double precision NOT NULL,
            PRIMARY KEY(provider, model, provider_key, hash)
        );
        CREATE INDEX cm_embedding_cache_age ON cm_embedding_cache(updated_at);
        CREATE TABLE cm_access(
            role_name name NOT NULL, workspace text NOT NULL, writable boolean NOT NULL DEFAULT false,
            PRIMARY KEY(role_name, workspace)
        );
        CREATE FUNCTION cm_readable() RETURNS text[] LANGUAGE sql STABLE AS $$
            SELECT coalesce(array_agg(a.workspace), '{}') FROM cm_access AS a
            WHERE EXISTS (SELECT 1 FROM pg_roles AS r WHERE r.rolname = a.role_name
                          AND pg_has_role(current_user, r.oid, 'MEMBER'))
        $$;
        CREATE FUNCTION cm_writable() RETURNS text[] LANGUAGE sql STABLE AS $$
            SELECT coalesce(array_agg(a.workspace), '{}') FROM cm_access AS a
            WHERE a.writable AND EXISTS (SELECT 1 FROM pg_roles AS r WHERE r.rolname = a.role_name
                                         AND pg_has_role(current_user, r.oid, 'MEMBER'))
        $$;
        GRANT SELECT ON cm_access TO PUBLIC;
    """),
]


def _policies_of(table: str) -> str:
    return f"""
        ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
        CREATE POLICY {table}_read ON {table} FOR SELECT USING (workspace IN (SELECT unnest(cm_readable())));
        CREATE POLICY {table}_add ON {table} FOR INSERT WITH CHECK (workspace IN (SELECT unnest(cm_writable())));
        CREATE POLICY {table}_change ON {table} FOR UPDATE USING (workspace IN (SELECT unnest(cm_writable())))
            WITH CHECK (workspace IN (SELECT unnest(cm_writable())));
        CREATE POLICY {table}_drop ON {table} FOR DELETE USING (workspace IN (SELECT unnest(cm_writable())));
    """


MIGRATIONS.append(("0002_row_level_security", "".join(_policies_of(table) for table in (
    "cm_workspaces", "cm_meta", "cm_files", "cm_chunks", "cm_terms", "cm_stats", "cm_jobs"))))  # the tables of its day
MIGRATIONS.append(("0003_leaner_writes", """
    DROP INDEX cm_chunks_hash;
    DROP INDEX cm_terms_prefix;
    ALTER TABLE cm_terms ALTER COLUMN term TYPE text COLLATE "C";
"""))  # nothing looked chunks up by hash; terms in byte order: the key's index serves a prefix's range too


def _drop_hnsw_indexes_of(table: str) -> str:
    """SQL dropping the per-size HNSW indexes (`cm_chunks_hnsw_<dims>`) made on `table` before migration 0006."""
    return f"""
    DO $$
    DECLARE name text;
    BEGIN
        FOR name IN SELECT indexname FROM pg_indexes WHERE tablename = '{table}'
                    AND indexname LIKE 'cm\\_chunks\\_hnsw\\_%' LOOP
            EXECUTE format('DROP INDEX %I', name);
        END LOOP;
    END $$;
"""


MIGRATIONS.append(("0004_chunks_partitioned_by_workspace", """
    CREATE FUNCTION cm_partition_name(ws text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
        SELECT 'cm_chunks_' || md5(ws)
    $$;
    CREATE FUNCTION cm_add_partition(ws text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF cm_chunks FOR VALUES IN (%L)',
                       cm_partition_name(ws), ws);
    END $$;
    ALTER TABLE cm_chunks RENAME TO cm_chunks_unpartitioned;
    ALTER TABLE cm_chunks_unpartitioned ALTER COLUMN seq DROP DEFAULT;
    ALTER SEQUENCE cm_chunks_seq_seq OWNED BY NONE;
    ALTER INDEX cm_chunks_pkey RENAME TO cm_chunks_unpartitioned_pkey;
    ALTER INDEX cm_chunks_workspace_gen_id_key RENAME TO cm_chunks_unpartitioned_id;
    ALTER INDEX cm_chunks_path RENAME TO cm_chunks_unpartitioned_path;
    ALTER INDEX cm_chunks_pending RENAME TO cm_chunks_unpartitioned_pending;
    ALTER INDEX cm_chunks_terms RENAME TO cm_chunks_unpartitioned_terms;
""" + _drop_hnsw_indexes_of("cm_chunks_unpartitioned") + """    CREATE TABLE cm_chunks(
        seq bigint NOT NULL DEFAULT nextval('cm_chunks_seq_seq'),
        workspace text NOT NULL, gen bigint NOT NULL,
        id text NOT NULL, path text NOT NULL, source text NOT NULL DEFAULT 'memory',
        start_line integer NOT NULL, end_line integer NOT NULL,
        hash text NOT NULL, model text NOT NULL DEFAULT '', text text NOT NULL, date text,
        embedded boolean NOT NULL DEFAULT false, updated_at double precision NOT NULL,
        terms text[] NOT NULL, counts integer[] NOT NULL, length integer NOT NULL,
        dims integer, embedding vector,
        PRIMARY KEY(workspace, seq),
        UNIQUE(workspace, gen, id)
    ) PARTITION BY LIST (workspace);
    ALTER SEQUENCE cm_chunks_seq_seq OWNED BY cm_chunks.seq;
    CREATE INDEX cm_chunks_path ON cm_chunks(workspace, gen, path, start_line);
    CREATE INDEX cm_chunks_pending ON cm_chunks(workspace, gen, seq) WHERE NOT embedded;
    CREATE INDEX cm_chunks_terms ON cm_chunks USING gin(terms);
    SELECT cm_add_partition(workspace) FROM (SELECT workspace FROM cm_workspaces
                                             UNION SELECT workspace FROM cm_access) AS known;
    INSERT INTO cm_chunks SELECT seq, workspace, gen, id, path, source, start_line, end_line, hash, model, text,
        date, embedded, updated_at, terms, counts, length, dims, embedding FROM cm_chunks_unpartitioned;
    DO $$
    DECLARE size integer;
    DECLARE sizes integer[] := ARRAY(SELECT DISTINCT dims FROM cm_chunks WHERE dims IS NOT NULL);
    BEGIN
        FOREACH size IN ARRAY sizes LOOP
            EXECUTE format('CREATE INDEX cm_chunks_hnsw_%s ON cm_chunks USING hnsw ((embedding::vector(%s))'
                           ' vector_cosine_ops) WHERE dims = %s', size, size, size);
        END LOOP;
    END $$;
    DROP TABLE cm_chunks_unpartitioned;
""" + _policies_of("cm_chunks")))  # each workspace's chunks, keyword and vector indexes apart: costs flat in their number

MIGRATIONS.append(("0005_workspace_writer", """
    ALTER TABLE cm_workspaces ADD COLUMN writer text, ADD COLUMN writer_host text, ADD COLUMN writer_since double precision;
"""))  # which folder writes each workspace (a hash of machine and folder), so that two cannot both

def _index_vectors_function(create: str, partition: str, graph: str = "") -> str:
    """`cm_index_vectors(ws, g, d)`: build generation g's HNSW graph of d-dimension vectors in the
    partition `partition(ws)` names, for any role that may write the workspace (SECURITY DEFINER),
    with memory for the graph; false when it exists already or there is no partition."""
    return f"""    {create} cm_index_vectors(ws text, g bigint, d integer) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    DECLARE n bigint;
    BEGIN
        IF NOT cm_caller_writes(ws) THEN
            RAISE EXCEPTION 'may not index the vectors of workspace %', ws USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF to_regclass(quote_ident({partition}(ws))) IS NULL
           OR to_regclass(quote_ident(cm_vector_index_name(ws, g, d))) IS NOT NULL THEN
            RETURN false;
        END IF;
        EXECUTE format('SELECT count(*) FROM %I WHERE gen = %s AND dims = %s', {partition}(ws), g, d) INTO n;
        PERFORM set_config('maintenance_work_mem',
                           least(1048576, greatest(65536, n * (d * 4 + 512) * 13 / 10240))::text || 'kB', true);
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I USING hnsw ((embedding::vector(%s)) vector_cosine_ops)'
                       '{graph} WHERE gen = %s AND dims = %s', cm_vector_index_name(ws, g, d), {partition}(ws), d, g, d);
        RETURN true;
    END $$;
"""


MIGRATIONS.append(("0006_vector_indexes_per_generation", _drop_hnsw_indexes_of("cm_chunks") + """
    CREATE FUNCTION cm_vector_index_name(ws text, g bigint, d integer) RETURNS text LANGUAGE sql IMMUTABLE AS $$
        SELECT 'cm_hnsw_' || md5(ws) || '_' || g || '_' || d
    $$;
    CREATE FUNCTION cm_caller_writes(ws text) RETURNS boolean LANGUAGE sql STABLE AS $$
        WITH caller AS (SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                                    ELSE current_setting('role') END AS name)
        SELECT pg_has_role((SELECT name FROM caller), (SELECT relowner FROM pg_class
                                                       WHERE oid = 'cm_chunks'::regclass), 'MEMBER')
            OR EXISTS (SELECT 1 FROM cm_access AS a JOIN pg_roles AS r ON r.rolname = a.role_name
                       WHERE a.workspace = ws AND a.writable AND pg_has_role((SELECT name FROM caller), r.oid, 'MEMBER'))
    $$;
""" + _index_vectors_function("CREATE FUNCTION", "cm_partition_name") + """    CREATE FUNCTION cm_drop_vector_indexes(ws text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    DECLARE live bigint; live_dims text; name text; dropped integer := 0;
    BEGIN
        IF NOT cm_caller_writes(ws) THEN
            RAISE EXCEPTION 'may not drop the vector indexes of workspace %', ws USING ERRCODE = 'insufficient_privilege';
        END IF;
        SELECT live_gen INTO live FROM cm_workspaces WHERE workspace = ws;
        SELECT value INTO live_dims FROM cm_meta WHERE workspace = ws AND gen = live AND key = 'vector_dims';
        FOR name IN SELECT c.relname FROM pg_class AS c WHERE c.relkind = 'i'
                    AND c.relname LIKE 'cm\\_hnsw\\_' || md5(ws) || '\\_%'
                    AND (split_part(c.relname, '_', 4) <> live::text
                         OR (live_dims IS NOT NULL AND split_part(c.relname, '_', 5) <> live_dims)) LOOP
            EXECUTE format('DROP INDEX %I', name);
            dropped := dropped + 1;
        END LOOP;
        RETURN dropped;
    END $$;
    INSERT INTO cm_meta SELECT DISTINCT c.workspace, c.gen, 'vector_dims', c.dims::text
        FROM cm_chunks AS c JOIN cm_workspaces AS w ON w.workspace = c.workspace AND w.live_gen = c.gen
        WHERE c.dims IS NOT NULL ON CONFLICT DO NOTHING;
    SELECT cm_index_vectors(w.workspace, w.live_gen, m.value::integer) FROM cm_workspaces AS w
        JOIN cm_meta AS m ON m.workspace = w.workspace AND m.gen = w.live_gen AND m.key = 'vector_dims';
"""))  # each generation's vectors get their HNSW graph built whole, after its embedding pass: kept up row by
# row, pgvector spent 90 % of a cold hybrid index's writes on it


MIGRATIONS.append(("0007_vectors_apart_from_chunks", """
    CREATE TABLE cm_vectors(
        workspace text NOT NULL, gen bigint NOT NULL, seq bigint NOT NULL, hash text NOT NULL,
        embedded boolean NOT NULL DEFAULT false, model text NOT NULL DEFAULT '', dims integer, embedding vector,
        PRIMARY KEY(workspace, gen, seq)
    ) PARTITION BY LIST (workspace);
    CREATE INDEX cm_vectors_pending ON cm_vectors(workspace, gen, seq) WHERE NOT embedded;
    CREATE FUNCTION cm_vector_partition_name(ws text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
        SELECT 'cm_vectors_' || md5(ws)
    $$;
    CREATE OR REPLACE FUNCTION cm_add_partition(ws text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF cm_chunks FOR VALUES IN (%L)',
                       cm_partition_name(ws), ws);
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF cm_vectors FOR VALUES IN (%L)',
                       cm_vector_partition_name(ws), ws);
    END $$;
    SELECT cm_add_partition(workspace) FROM (SELECT workspace FROM cm_workspaces
                                             UNION SELECT workspace FROM cm_access) AS known;
    INSERT INTO cm_vectors SELECT workspace, gen, seq, hash, embedded, model, dims, embedding FROM cm_chunks;
    ALTER TABLE cm_chunks DROP COLUMN embedded, DROP COLUMN model, DROP COLUMN dims, DROP COLUMN embedding;
    CREATE FUNCTION cm_chunks_added() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO cm_vectors(workspace, gen, seq, hash) SELECT workspace, gen, seq, hash FROM added;
        RETURN NULL;
    END $$;
    CREATE TRIGGER cm_chunks_added AFTER INSERT ON cm_chunks REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION cm_chunks_added();
""" + _index_vectors_function("CREATE OR REPLACE FUNCTION", "cm_vector_partition_name",
                          " WITH (m = 12, ef_construction = 48)") + _policies_of("cm_vectors") + """
    DO $$
    DECLARE a record;
    BEGIN
        FOR a IN SELECT c.role_name, bool_or(c.writable) AS writable FROM cm_access AS c
                 JOIN pg_roles AS r ON r.rolname = c.role_name GROUP BY c.role_name LOOP
            EXECUTE format('GRANT %s ON cm_vectors TO %I',
                           CASE WHEN a.writable THEN 'SELECT, INSERT, UPDATE, DELETE' ELSE 'SELECT' END, a.role_name);
        END LOOP;
    END $$;
    SELECT cm_index_vectors(w.workspace, w.live_gen, m.value::integer) FROM cm_workspaces AS w
        JOIN cm_meta AS m ON m.workspace = w.workspace AND m.gen = w.live_gen AND m.key = 'vector_dims';
"""))  # a vector stored is a narrow row's update: on the chunk's row it was a new version of the whole row, taken
# again by every index of it (the keyword index's GIN the dearest). The graph is built with m 12, ef_construction 48
# (pgvector's defaults: 16, 64): on 44,941 real MiniLM vectors, a third less build time for recall@10 0.987-0.989
# against 0.994 (ef_search 100, what a search asks at least; docs/benchmarks.md)

MIGRATIONS.append(("0008_leaner_vector_graphs", _index_vectors_function(
    "CREATE OR REPLACE FUNCTION", "cm_vector_partition_name", " WITH (m = 8, ef_construction = 32)")))
# graphs built from now on (each generation's own) take m 8, ef_construction 32: on the same real vectors a build of
# ~0.55 of m 12 / 48's, and a search asking ef_search 300 (pg/store.py) finds what m 12 did at 100 or better (recall@10
# 0.987 vs 0.988, recall@50 0.975 vs 0.962) for ~0.7 ms more. A graph already built keeps its parameters.

MIGRATIONS.append(("0009_cache_read_by_text_only", """
    CREATE FUNCTION cm_caller_writes_any() RETURNS boolean LANGUAGE sql STABLE AS $$
        WITH caller AS (SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                                    ELSE current_setting('role') END AS name)
        SELECT pg_has_role((SELECT name FROM caller), (SELECT relowner FROM pg_class
                                                       WHERE oid = 'cm_chunks'::regclass), 'MEMBER')
            OR EXISTS (SELECT 1 FROM cm_access AS a JOIN pg_roles AS r ON r.rolname = a.role_name
                       WHERE a.writable AND pg_has_role((SELECT name FROM caller), r.oid, 'MEMBER'))
    $$;
    CREATE FUNCTION cm_cached(p text, m text, k text, hashes text[], touched double precision)
    RETURNS TABLE(hash text, embedding bytea) LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    BEGIN
        IF NOT cm_caller_writes_any() THEN
            RAISE EXCEPTION 'may not read the embedding cache' USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF touched IS NULL THEN
            RETURN QUERY SELECT e.hash, e.embedding FROM cm_embedding_cache AS e
                WHERE e.provider = p AND e.model = m AND e.provider_key = k AND e.hash = ANY(hashes);
        ELSE
            RETURN QUERY UPDATE cm_embedding_cache AS e SET updated_at = touched
                WHERE e.provider = p AND e.model = m AND e.provider_key = k AND e.hash = ANY(hashes)
                RETURNING e.hash, e.embedding;
        END IF;
    END $$;
    CREATE FUNCTION cm_uncached(p text, m text, k text, hashes text[]) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    BEGIN
        IF NOT cm_caller_writes_any() THEN
            RAISE EXCEPTION 'may not read the embedding cache' USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN QUERY SELECT DISTINCT h.hash FROM unnest(hashes) AS h(hash) WHERE NOT EXISTS (
            SELECT 1 FROM cm_embedding_cache AS e WHERE e.provider = p AND e.model = m AND e.provider_key = k
            AND e.hash = h.hash);
    END $$;
    CREATE FUNCTION cm_cache(p text, m text, k text, hashes text[], embeddings bytea[], at double precision)
    RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    BEGIN
        IF NOT cm_caller_writes_any() THEN
            RAISE EXCEPTION 'may not add to the embedding cache' USING ERRCODE = 'insufficient_privilege';
        END IF;
        INSERT INTO cm_embedding_cache SELECT p, m, k, v.hash, v.embedding, length(v.embedding) / 4, at
            FROM unnest(hashes, embeddings) AS v(hash, embedding) ORDER BY v.hash
            ON CONFLICT(provider, model, provider_key, hash) DO NOTHING;
    END $$;
    REVOKE ALL ON cm_embedding_cache FROM PUBLIC;
    DO $$
    DECLARE a record;
    BEGIN
        FOR a IN SELECT DISTINCT c.role_name FROM cm_access AS c JOIN pg_roles AS r ON r.rolname = c.role_name LOOP
            EXECUTE format('REVOKE ALL ON cm_embedding_cache FROM %I', a.role_name);
        END LOOP;
    END $$;
"""))  # the fleet's cache held every workspace's vectors, and a vector gives much of its text back (embedding
# inversion): a role read them all with a hand-written SELECT. Now only a writer reaches it, through these
# functions, and only by the hash of a text it holds itself: it learns whether some workspace embedded that same
# text (what sharing the cache means), never another workspace's vectors it could not make

MIGRATIONS.append(("0010_drop_a_generations_graphs", """
    CREATE FUNCTION cm_drop_generation_vector_indexes(ws text, g bigint) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    DECLARE name text; dropped integer := 0;
    BEGIN
        IF NOT cm_caller_writes(ws) THEN
            RAISE EXCEPTION 'may not drop the vector indexes of workspace %', ws USING ERRCODE = 'insufficient_privilege';
        END IF;
        FOR name IN SELECT c.relname FROM pg_class AS c WHERE c.relkind = 'i'
                    AND c.relname LIKE 'cm\\_hnsw\\_' || md5(ws) || '\\_' || g || '\\_%' LOOP
            EXECUTE format('DROP INDEX %I', name);
            dropped := dropped + 1;
        END LOOP;
        RETURN dropped;
    END $$;
"""))  # an in-place model switch replaces every vector of the live generation: with its graph kept, pgvector
# inserted each new vector into it one by one (at 2,000 notes a switch back from the cache took 3.1 s, 1.75 s
# with the graph dropped first and built whole after the fill)

# Every function of the schema resolves names in the schema (after pg_catalog) and in pg_temp last. Left to the
# caller's search_path, PostgreSQL looks relations up in the caller's pg_temp first, and any role may create
# temporary tables: a `cm_access` or `pg_roles` of its own then granted it every workspace, through the
# row-level security policies and the SECURITY DEFINER functions alike. Run after every migration, so a
# function a later one (re)creates is pinned too (`CREATE OR REPLACE` drops the settings it does not repeat).
_PIN_SEARCH_PATHS = """
    DO $$
    DECLARE f record;
    BEGIN
        FOR f IN SELECT p.oid::regprocedure AS signature, n.nspname AS schema FROM pg_catalog.pg_proc AS p
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                 WHERE p.proname LIKE 'cm\\_%' AND n.nspname = current_schema() LOOP
            EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f.signature, f.schema);
        END LOOP;
    END $$;
"""

MIGRATIONS.append(("0011_search_paths_pinned", _PIN_SEARCH_PATHS + """
    ALTER TABLE cm_access ENABLE ROW LEVEL SECURITY;
    CREATE POLICY cm_access_own ON cm_access FOR SELECT USING (EXISTS (
        SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = cm_access.role_name
        AND pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER')));
"""))  # and a role reads only its own grants: every login listed every workspace's name and who writes it

MIGRATIONS.append(("0012_partitions_attached", """
    CREATE OR REPLACE FUNCTION cm_add_partition(ws text) RETURNS void LANGUAGE plpgsql SET lock_timeout = '5s' AS $$
    DECLARE parent text; part text;
    BEGIN
        FOREACH parent IN ARRAY ARRAY['cm_chunks', 'cm_vectors'] LOOP
            part := CASE parent WHEN 'cm_chunks' THEN cm_partition_name(ws) ELSE cm_vector_partition_name(ws) END;
            IF to_regclass(quote_ident(part)) IS NULL THEN
                EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)', part, parent);
            END IF;
            IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = to_regclass(quote_ident(part))) THEN
                EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%L)', parent, part, ws);
            END IF;
        END LOOP;
    END $$;
"""))  # a new workspace's partitions are made apart and attached: CREATE TABLE ... PARTITION OF waited for an
# exclusive lock on the parent, behind any tenant's open transaction that had read it, and every other tenant's
# query then queued behind it (a fleet frozen by one idle session). ATTACH takes a lock readers and writers never
# wait for; the few that conflict with it (another DDL) give up after 5 s instead of queueing the fleet.

MIGRATIONS.append(("0013_graph_ddl_gives_up", """
    ALTER FUNCTION cm_index_vectors(text, bigint, integer) SET lock_timeout = '5s';
    ALTER FUNCTION cm_drop_vector_indexes(text) SET lock_timeout = '5s';
    ALTER FUNCTION cm_drop_generation_vector_indexes(text, bigint) SET lock_timeout = '5s';
"""))  # a DROP INDEX queues for an exclusive lock on the workspace's partition, and the workspace's readers queue
# behind it: while a reader of that workspace sits in an open transaction, the DDL gives up after 5 s (the graph is
# built, or a stale one dropped, at a later pass) instead of holding every search of the workspace up

MIGRATIONS.append(("0014_chunk_dates", """
    CREATE INDEX IF NOT EXISTS cm_chunks_date ON cm_chunks(workspace, gen, date) WHERE date IS NOT NULL;
"""))  # the days a query names are read as a window of dated chunks (search.date_prior): a range of this index, not a
# scan of the workspace's partition

MIGRATIONS.append(("0015_chunk_annotations", """
    ALTER TABLE cm_chunks ADD COLUMN importance integer, ADD COLUMN triggers text, ADD COLUMN projects text;
    CREATE INDEX IF NOT EXISTS cm_chunks_annotated ON cm_chunks(workspace, gen, seq)
        WHERE importance IS NOT NULL OR triggers IS NOT NULL OR projects IS NOT NULL;
"""))  # OpenClaw's annotations of an entry (clawmem_index.text.annotations), on the few chunks that carry any


class Session(Protocol):
    """What `migrate` uses of a connection: psycopg's own, or the store's (pg.connection.Connection)."""

    def execute(self, query: Any, args: Any = None, /) -> Any: ...
    def transaction(self) -> contextlib.AbstractContextManager[Any]: ...


def migrate(conn: Session) -> None:
    """Apply what this database has not had, under an advisory lock (daemons may start together).

    A role that may not create tables gets IndexUnavailable naming what to run, rather than an
    index missing half its schema.
    """
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
    try:
        exists = conn.execute("SELECT to_regclass('cm_migrations') IS NOT NULL").fetchone()
        done: set[str] = set()
        if exists and exists[0]:
            done = {row[0] for row in conn.execute("SELECT name FROM cm_migrations")}
        missing = [(name, body) for name, body in MIGRATIONS if name not in done]
        if not missing:
            return
        try:
            with conn.transaction():
                conn.execute("CREATE TABLE IF NOT EXISTS cm_migrations(name text PRIMARY KEY,"
                             " applied_at double precision NOT NULL)")
                conn.execute("GRANT SELECT ON cm_migrations TO PUBLIC")
                for name, body in missing:
                    conn.execute(body)
                    conn.execute("INSERT INTO cm_migrations VALUES(%s, %s)", (name, time.time()))
                conn.execute(_PIN_SEARCH_PATHS)
        except psycopg.errors.InsufficientPrivilege as exc:
            if not _has_vector(conn):
                raise IndexUnavailable(
                    "the shared index needs PostgreSQL's `vector` extension (pgvector) in this database, and only a"
                    " superuser may add it: a superuser connected to it runs `CREATE EXTENSION vector` once, then the"
                    " database's owner runs `clawmem index`") from exc
            raise IndexUnavailable(
                f"the shared index's schema is missing {', '.join(n for n, _ in missing)} and this role may not"
                f" create it ({exc.diag.message_primary}): run `clawmem index` once as the database's owner") from exc
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))


def _has_vector(conn: Session) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'vector')").fetchone()
    return bool(row and row[0])
