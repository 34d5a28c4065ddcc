"""The shared index's security boundary, attacked the way a tenant would: with its own SQL.

Every role here logs in to the real PostgreSQL with only what `grant_workspace` gave it, and
tries what any login may do (temporary tables shadowing the schema's, the schema's own functions
called by hand). The owner then checks that the other tenant's memory is whole, and clawmem that
an index changed behind its back is never called fresh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from hostile import FIXED_SQL_SHADOWS

from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.index.pg.schema import grant_workspace
from clawmem_index.search.ranking import SearchRequest


def shared(workspace: Path, url: str) -> Settings:
    return load_settings(workspace=workspace, overrides={"embedding.provider": "none", "index_backend": "postgres",
                                                         "index_url": url})


@pytest.fixture
def tenants(tmp_path: Path, pg_url: str, pg_role):  # type: ignore[no-untyped-def]
    """Workspaces alpha and beta indexed by the owner; a reader and a writer of alpha (their URLs), a writer of beta."""
    for name in ("alpha", "beta"):
        ws = tmp_path / name
        (ws / "memory").mkdir(parents=True)
        (ws / "MEMORY.md").write_text(f"# {name}\n\nThe {name} team keeps its launch code here.\n")
        (ws / "memory" / "secret.md").write_text(f"the {name} launch code is {len(name) * 1111}\n")
        index = MemoryIndex(shared(ws, pg_url))
        try:
            index.sync()
        finally:
            index.close()
    (reader, reader_url), (writer, writer_url), (other, _) = pg_role("reader"), pg_role("writer"), pg_role("other")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, reader, "alpha")
        grant_workspace(conn, writer, "alpha", writable=True)
        grant_workspace(conn, other, "beta", writable=True)  # beta's own agent: a grant the attacker can borrow
        before = conn.execute("SELECT count(*), string_agg(text, '|' ORDER BY seq) FROM cm_chunks"
                              " WHERE workspace = 'beta'").fetchone()
    return {"reader": reader_url, "writer": writer_url, "beta_before": before, "root": tmp_path}


def beta_rows(pg_url: str) -> tuple[int, str]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*), string_agg(text, '|' ORDER BY seq) FROM cm_chunks"
                           " WHERE workspace = 'beta'").fetchone()
    assert row is not None
    return row


@pytest.mark.parametrize("shadow", sorted(FIXED_SQL_SHADOWS))
@pytest.mark.parametrize("who", ["reader", "writer"])
def test_a_temporary_table_shadowing_the_schema_gives_a_role_no_other_workspace(tenants, pg_url: str, who: str,
                                                                                shadow: str) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(tenants[who], autocommit=True) as conn:
        for statement in FIXED_SQL_SHADOWS[shadow].split(";"):
            conn.execute(statement)  # type: ignore[arg-type]
        assert {r[0] for r in conn.execute("SELECT workspace FROM cm_chunks")} == {"alpha"}
        assert {r[0] for r in conn.execute("SELECT workspace FROM cm_vectors")} == {"alpha"}
        assert {r[0] for r in conn.execute("SELECT workspace FROM cm_files")} == {"alpha"}
        for attack in ("DELETE FROM cm_chunks WHERE workspace = 'beta'",
                       "UPDATE cm_chunks SET text = 'planted' WHERE workspace = 'beta'",
                       "DELETE FROM cm_files WHERE workspace = 'beta'"):
            try:
                assert conn.execute(attack).rowcount == 0  # type: ignore[arg-type]
            except psycopg.errors.InsufficientPrivilege:
                pass  # the reader may not write at all
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT cm_drop_vector_indexes('beta')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT cm_index_vectors('beta', 0, 3)")
        if who == "reader":
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM cm_cached('p', 'm', 'k', '{h}', NULL)")
    assert beta_rows(pg_url) == tenants["beta_before"]
    beta = MemoryIndex(shared(tenants["root"] / "beta", pg_url), read_only=True)
    try:
        assert beta.status()["fresh"] is True
        found = beta.search(SearchRequest("launch code", mode="bm25"))["results"]
        assert {r["path"] for r in found} == {"MEMORY.md", "memory/secret.md"}
        assert all("planted" not in r["snippet"] for r in found)
    finally:
        beta.close()


def test_every_function_of_the_schema_looks_names_up_in_the_schema_before_temporary_tables(pg_url: str) -> None:
    """The class of hole, not one instance: a function of the schema resolving a name through the caller's
    search_path finds a temporary table first. Each one pins its own path with pg_temp last."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        functions = conn.execute(
            "SELECT p.oid::regprocedure::text, n.nspname, coalesce(p.proconfig, '{}') FROM pg_proc AS p"
            " JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE p.proname LIKE 'cm\\_%'").fetchall()
    assert len(functions) >= 10
    for name, schema, config in functions:
        assert f"search_path={schema}, pg_temp" in config, name
    # The DDL functions give up on a lock rather than queue a workspace's (or every workspace's) readers behind it.
    ddl = {name: config for name, _, config in functions if name.startswith(("cm_add_partition", "cm_index_vectors",
                                                                            "cm_drop_"))}
    assert len(ddl) == 4 and all("lock_timeout=5s" in config for config in ddl.values()), ddl


def test_a_role_sees_only_its_own_grants(tenants, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(tenants["reader"], autocommit=True) as conn:
        seen = conn.execute("SELECT role_name, workspace FROM cm_access").fetchall()
    assert [workspace for _, workspace in seen] == ["alpha"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM cm_access").fetchone() == (3,)


def test_rows_lost_behind_the_writers_back_are_reported_and_the_next_sync_puts_them_back(tenants, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    """Whatever removed them (a hole, an operator's DELETE), an index missing rows is not fresh, and a sync
    (not only `reindex`) repairs it."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM cm_chunks WHERE workspace = 'beta' AND path = 'memory/secret.md'")
    beta = MemoryIndex(shared(tenants["root"] / "beta", pg_url))
    try:
        status = beta.status()
        assert status["fresh"] is False
        assert any("outside clawmem" in reason for reason in status["stale_reasons"]), status["stale_reasons"]
        beta.sync()
        status = beta.status()
        assert status["fresh"] is True, status["stale_reasons"]
        found = beta.search(SearchRequest("launch code 4444", mode="bm25"))["results"]
        assert found and found[0]["path"] == "memory/secret.md"
    finally:
        beta.close()
    assert beta_rows(pg_url)[0] == tenants["beta_before"][0]


def test_a_tenants_open_transaction_does_not_hold_up_a_new_workspace_or_anyones_searches(tenants, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    """A reader left in a transaction that read the chunks; the owner adds workspace gamma meanwhile. Made with
    CREATE TABLE ... PARTITION OF, gamma's first sync queued for an exclusive lock and every query of every
    tenant queued behind it until the idle transaction ended."""
    root = tenants["root"]
    with psycopg.connect(tenants["reader"]) as idle:
        idle.execute("SELECT count(*) FROM cm_chunks")  # and the transaction stays open
        (root / "gamma" / "memory").mkdir(parents=True)
        (root / "gamma" / "MEMORY.md").write_text("# gamma\n\nThe gamma team keeps its launch code here.\n")
        gamma = MemoryIndex(shared(root / "gamma", pg_url))
        try:
            assert gamma.sync().added == 1
        finally:
            gamma.close()
        alpha = MemoryIndex(shared(root / "alpha", tenants["reader"]), read_only=True)
        try:
            assert alpha.search(SearchRequest("launch code", mode="bm25"))["results"]
        finally:
            alpha.close()
        assert idle.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def test_a_tenant_locking_the_chunks_costs_others_a_clear_error_not_a_hang(tenants, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    """A writer may lock the table it writes (its UPDATE right lets it): readers then give up after their
    statement timeout with the reason, `status` says the index is not fresh and why, and all is well once
    the lock goes."""
    from clawmem_index.errors import IndexUnavailable

    alpha = MemoryIndex(shared(tenants["root"] / "alpha", tenants["reader"]), read_only=True)
    try:
        with psycopg.connect(tenants["writer"]) as locker:
            locker.execute("LOCK TABLE cm_chunks IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(IndexUnavailable, match="did not answer in time"):
                alpha.search(SearchRequest("launch code", mode="bm25"))
            status = alpha.status()
            assert status["fresh"] is False
            assert any("did not answer in time" in reason for reason in status["stale_reasons"])
        assert alpha.search(SearchRequest("launch code", mode="bm25"))["results"]
        assert alpha.status()["fresh"] is True
    finally:
        alpha.close()


def test_hosts_cloned_from_one_image_are_two_writers(tmp_path: Path, pg_url: str) -> None:
    """Two clones share the machine id and the folder's path; each keeps its own local state. The second to
    write the workspace is refused, as another folder is, instead of replacing the first one's rows."""
    from clawmem_index.errors import WorkspaceTaken

    ws = tmp_path / "ops"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "lighthouse.md").write_text("lighthouse keeper notes\n")

    def clone(name: str) -> MemoryIndex:  # the same folder, machine and path; the clone's own cache
        return MemoryIndex(load_settings(workspace=ws, overrides={
            "embedding.provider": "none", "index_backend": "postgres", "index_url": pg_url,
            "index": str(tmp_path / name / "cache" / "unused.sqlite")}))

    first, second = clone("host-a"), clone("host-b")
    try:
        assert first.sync().added == 1
        with pytest.raises(WorkspaceTaken, match="another folder"):
            second.sync()
        assert first.sync().added == 0  # and the first is still the writer, at every pass
    finally:
        first.close()
        second.close()


def test_a_workspace_claimed_by_an_older_clawmem_stays_its_folders(tmp_path: Path, pg_url: str) -> None:
    """Claimed under the former identity (machine id and path), the folder upgrading keeps writing it and
    takes it under its new id; another folder is still refused."""
    from clawmem_index.errors import WorkspaceTaken
    from clawmem_index.index.backends import former_writer_identity

    ws = tmp_path / "ops"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "lighthouse.md").write_text("lighthouse keeper notes\n")
    index = MemoryIndex(shared(ws, pg_url))
    try:
        index.sync()
    finally:
        index.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE cm_workspaces SET writer = %s WHERE workspace = 'ops'", (former_writer_identity(ws),))
    (ws / "memory" / "harbour.md").write_text("harbour master notes\n")
    index = MemoryIndex(shared(ws, pg_url))
    try:
        assert index.sync().added == 1
    finally:
        index.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT writer FROM cm_workspaces WHERE workspace = 'ops'").fetchone() != \
            (former_writer_identity(ws),)
    other = tmp_path / "elsewhere" / "ops"
    (other / "memory").mkdir(parents=True)
    index = MemoryIndex(shared(other, pg_url))
    try:
        with pytest.raises(WorkspaceTaken):
            index.sync()
    finally:
        index.close()


def _clawmem(workspace: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLAWMEM_INDEX_BACKEND": "postgres", "CLAWMEM_INDEX_URL": url, "CLAWMEM_PROVIDER": "none"}
    return subprocess.run([sys.executable, "-m", "clawmem_index", *args, "--workspace", str(workspace)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_role_with_no_grant_gets_one_line_saying_so(tenants, pg_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    _, url = pg_role("nobody")
    for args in (("search", "launch", "--mode", "bm25"), ("search", "launch", "--workspace-set", "beta")):
        out = _clawmem(tenants["root"] / "alpha", url, *args)
        assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr
        assert "may not read the shared index" in out.stderr and "grants" in out.stderr
    status = _clawmem(tenants["root"] / "alpha", url, "status", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["fresh"] is False and "may not read the shared index" in data["stale_reasons"][0]


def test_a_writer_is_granted_the_temporary_tables_it_stages_chunks_in(tmp_path: Path, pg_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    """Databases where PUBLIC lost TEMP (a hardened server): a writable grant carries it, and a writer
    without it is told what to grant instead of a traceback."""
    from urllib.parse import urlsplit

    database = urlsplit(pg_url).path.lstrip("/")
    (granted, granted_url), (bare, bare_url) = pg_role("writer"), pg_role("bare")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC")
        grant_workspace(conn, granted, "gamma", writable=True)
        grant_workspace(conn, bare, "delta", writable=True)
        conn.execute(f"REVOKE TEMPORARY ON DATABASE {database} FROM {bare}")
    for name in ("gamma", "delta"):
        (tmp_path / name / "memory").mkdir(parents=True)
        (tmp_path / name / "MEMORY.md").write_text(f"# {name}\n\nthe {name} runbook\n")
    ok = _clawmem(tmp_path / "gamma", granted_url, "index")
    assert ok.returncode == 0, ok.stderr
    refused = _clawmem(tmp_path / "delta", bare_url, "index")
    assert refused.returncode == 3 and "Traceback" not in refused.stderr, refused.stderr
    assert f"GRANT TEMPORARY ON DATABASE {database} TO {bare}" in refused.stderr


def test_a_database_without_pgvector_is_put_to_a_superuser_not_to_its_owner(pg_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name = f"nv_{os.urandom(4).hex()}"
    owner = f"owner_{os.urandom(4).hex()}"
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN")
        conn.execute(f"CREATE DATABASE {name} OWNER {owner}")
    try:
        (tmp_path / "ws" / "memory").mkdir(parents=True)
        (tmp_path / "ws" / "MEMORY.md").write_text("# notes\n")
        out = _clawmem(tmp_path / "ws", pg_cluster.url(name, role=owner), "index")
        assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr
        assert "only a superuser" in out.stderr and "CREATE EXTENSION vector" in out.stderr
    finally:
        with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_daemon_answers_a_locked_shared_index_with_an_error_and_an_honest_status(tmp_path: Path, pg_url: str,
                                                                                    pg_role) -> None:  # type: ignore[no-untyped-def]
    """The socket's searches and status while a tenant holds the chunks locked: an error object and `fresh:
    false` with the reason, each within the reader's statement timeout; answers again once the lock goes."""
    from daemon_helpers import BOUND, RawClient, daemon_settings, running_daemon, short_dir, wait_until

    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "a.md").write_text("the ferry leaves at nine\n")
    writer, writer_url = pg_role("locker")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, writer, "other", writable=True)
    for sock_dir in short_dir():
        settings = daemon_settings(workspace, tmp_path, sock_dir, index_backend="postgres", index_url=pg_url)
        # Each answer waits for the reader's statement timeout (5 s) at most, once: room for a busy machine.
        with running_daemon(settings), RawClient(settings.socket_path, timeout=6 * BOUND) as client:
            def found() -> list[str]:
                reply = client.call("search", {"query": "ferry", "mode": "bm25"})
                return [r["path"] for r in reply.get("result", {}).get("results", [])]

            wait_until(lambda: found() == ["memory/a.md"], message="the first build")
            with psycopg.connect(writer_url) as locker:
                locker.execute("LOCK TABLE cm_chunks IN ACCESS EXCLUSIVE MODE")
                reply = client.call("search", {"query": "ferry nine", "mode": "bm25"})
                assert "did not answer in time" in reply["error"]["message"], reply
                status = client.call("status")["result"]
                assert status["fresh"] is False
                assert any("did not answer in time" in reason for reason in status["stale_reasons"]), status
            wait_until(lambda: found() == ["memory/a.md"], message="answers once the lock is gone")
