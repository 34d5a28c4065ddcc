"""Who may read and write which workspace of the shared index: `grant_workspace`, run by the tables' owner."""

from __future__ import annotations

import psycopg
from psycopg import sql

__all__ = ["WORKSPACE_TABLES", "grant_workspace"]

WORKSPACE_TABLES = ("cm_workspaces", "cm_meta", "cm_files", "cm_chunks", "cm_terms", "cm_stats", "cm_jobs",
                    "cm_vectors")


def grant_workspace(conn: psycopg.Connection, role: str, workspace: str, *, writable: bool = False) -> None:
    """Let `role` (and its members) read `workspace` in the shared index, and write it if `writable`.

    Run as the tables' owner. Reading also needs the tables; writing, the chunks' sequence, temporary
    tables and the workspace's partition of the chunks, made here (only the owner may add one).
    """
    with conn.transaction():
        conn.execute("INSERT INTO cm_access VALUES(%s, %s, %s) ON CONFLICT(role_name, workspace)"
                     " DO UPDATE SET writable = excluded.writable", (role, workspace, writable))
        conn.execute("SELECT cm_add_partition(%s)", (workspace,))
        who = sql.Identifier(role)
        rights = sql.SQL("SELECT, INSERT, UPDATE, DELETE" if writable else "SELECT")
        for table in WORKSPACE_TABLES:  # not the fleet's embedding cache: writers reach it through cm_cached
            conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(rights, sql.Identifier(table), who))
        if writable:
            conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE cm_chunks_seq_seq TO {}").format(who))
            # a writer stages its chunks in a temporary table (COPY cannot write where row-level security applies)
            conn.execute(sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
                sql.Identifier(conn.info.dbname), who))
