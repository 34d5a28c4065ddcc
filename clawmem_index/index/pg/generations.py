"""A workspace's place in the shared index: its row and partition, its generations' rows, its writer.

A store works on one generation of its workspace: the live one, or a new one a rebuild fills
and switches to. The rows of the others go at the switch, or, left by a rebuild that died, at
the next write lock (`strays`).
"""

from __future__ import annotations

import contextlib
import time

import psycopg
from psycopg import sql

from clawmem_index.errors import IndexUnavailable, WorkspaceTaken
from clawmem_index.index.pg.connection import Connection

__all__ = ["GENERATION_TABLES", "Generations"]

GENERATION_TABLES = ("cm_meta", "cm_files", "cm_chunks", "cm_vectors", "cm_terms", "cm_stats")  # rows of one generation


class Generations:
    """One workspace's row in `cm_workspaces`, its partition, and the rows of its generations, on a store's
    connection (in the store's transaction when it has one open)."""

    def __init__(self, conn: Connection, workspace: str) -> None:
        self.conn = conn
        self.workspace = workspace

    def open(self, *, new: bool, create: bool) -> int:
        """The generation to work on: a new one, or the live one (the workspace and its partition made
        first, with `create`)."""
        if create:
            self.conn.execute("INSERT INTO cm_workspaces(workspace, created_at) VALUES(%s, %s)"
                              " ON CONFLICT DO NOTHING", (self.workspace, time.time()))
            self._add_partition()
        if new:
            row = self.conn.execute("UPDATE cm_workspaces SET next_gen = next_gen + 1 WHERE workspace = %s"
                                    " RETURNING next_gen - 1", (self.workspace,)).fetchone()
        else:
            row = self.conn.execute("SELECT live_gen FROM cm_workspaces WHERE workspace = %s",
                                    (self.workspace,)).fetchone()
        if row is None:
            raise IndexUnavailable(f"no index of workspace {self.workspace!r} in the shared index yet:"
                                   " run `clawmem index` first")
        return int(row[0])

    def _add_partition(self) -> None:
        """This workspace's partition of the chunks (see clawmem_index.index.pg.schema), made if missing."""
        found = self.conn.execute("SELECT to_regclass(cm_vector_partition_name(%s)) IS NOT NULL",
                                  (self.workspace,)).fetchone()
        if found and found[0]:
            return
        try:
            self.conn.execute("SELECT cm_add_partition(%s)", (self.workspace,))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise IndexUnavailable(
                f"workspace {self.workspace!r} has no place in the shared index yet, and this role may not make"
                " it: the database's owner grants it with clawmem_index.index.pg.schema.grant_workspace") from exc

    def switch(self, to: int) -> None:
        """Make generation `to` the live one and drop the others' rows (inside the caller's transaction)."""
        self.conn.execute("UPDATE cm_workspaces SET live_gen = %s WHERE workspace = %s",
                          (to, self.workspace))
        self.drop_others(keep=to)

    def claim(self, writer: str, host: str, *, take_over: bool = False, formerly: str | None = None) -> None:
        """Make sure the folder `writer` names is the one writing this workspace: the first to write it
        claims it; another folder is refused with WorkspaceTaken unless it takes it over, or the
        workspace is claimed by `formerly`, this folder's identity of an older clawmem.

        Read first and written only when it changes, so a writer's every lock costs no commit.
        """
        row = self.conn.execute("SELECT writer, writer_host, writer_since FROM cm_workspaces WHERE workspace = %s",
                                (self.workspace,)).fetchone()
        if row is not None and row[0] == writer:
            return
        if row is not None and row[0] is not None and row[0] != formerly and not take_over:
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(row[2])) if row[2] else "an earlier run"
            raise WorkspaceTaken(
                f"workspace {self.workspace!r} of the shared index is written by another folder (host {row[1]},"
                f" since {since}); two writers of one name would each drop the other's files from it. Give this"
                f" folder another workspace_name, or run `clawmem take-over` here to move the workspace to it")
        self.conn.execute("UPDATE cm_workspaces SET writer = %s, writer_host = %s, writer_since = %s"
                          " WHERE workspace = %s", (writer, host, time.time(), self.workspace))

    def settle(self) -> None:
        """After a bulk write, merge the keyword index's pending entries now (GIN keeps recent insertions
        in a list every search scans whole, and the next small write would merge them itself), and
        give the planner the partition's statistics (until autovacuum's first round it guesses from
        the pages, and at a few thousand chunks it scanned the whole workspace for a rare word:
        15 ms a query instead of 0.5). The first queries and the first edit after a rebuild then cost
        what later ones do. Only the tables' owner may; for other roles autovacuum does both within
        its next rounds."""
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege), self.conn.transaction():
            self.conn.execute("SET LOCAL default_statistics_target = 10")  # a small sample: enough for the plan
            row = self.conn.execute("SELECT cm_partition_name(%s)", (self.workspace,)).fetchone()
            if row is not None:
                self.conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(row[0])))
        names = self.conn.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " JOIN pg_am AS a ON a.oid = c.relam WHERE a.amname = 'gin'"
            " AND i.indrelid = to_regclass(quote_ident(cm_partition_name(%s)))", (self.workspace,)).fetchall()
        for (name,) in names:
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                self.conn.execute("SELECT gin_clean_pending_list(%s::regclass)", (name,))

    def strays(self, live: int) -> bool:
        """Whether rows of generations other than `live` are left (a rebuild that died before its switch).

        Rows are looked for first, through the keys, which lead with workspace and generation: every write
        lock asks, and a commit for nothing would move the version every reader's cache follows. Each
        side of the live generation is its own range: with `gen < g OR gen > g` the planner read every
        key of the workspace (72 ms an edit in the term statistics alone at 20,000 notes).
        """
        found = self.conn.execute(
            "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {table} WHERE workspace = %(w)s AND gen {side} %(g)s)"
                                    for table in GENERATION_TABLES for side in "<>"),
            {"w": self.workspace, "g": live}).fetchone()
        return bool(found and found[0])

    def drop(self, gen: int) -> None:
        """A generation's rows, in a transaction of their own."""
        with self.conn.transaction():
            for table in GENERATION_TABLES:
                self.conn.execute(f"DELETE FROM {table} WHERE workspace = %s AND gen = %s",  # noqa: S608
                                  (self.workspace, gen))

    def drop_others(self, keep: int) -> None:
        for table in GENERATION_TABLES:
            self.conn.execute(f"DELETE FROM {table} WHERE workspace = %(w)s AND (gen < %(g)s OR gen > %(g)s)",  # noqa: S608
                              {"w": self.workspace, "g": keep})
