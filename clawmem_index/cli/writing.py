"""`clawmem` commands that write: init, index, reindex, take-over, grant; and how a run reports itself."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from clawmem_index.cli.base import (
    Context,
    cli,
    ctx_of,
    global_options,
    interrupted,
    run,
)
from clawmem_index.errors import IndexUnavailable


@cli.command()
@click.argument("directory", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Show what would be copied; write nothing.")
def init(directory: Path, dry_run: bool) -> None:
    """Create a starter workspace in DIRECTORY (never overwrites a file)."""
    from clawmem_index.sources.template import copy_template

    def action() -> None:
        for rel, status in copy_template(directory, dry_run=dry_run):
            verb = {"create": "would create" if dry_run else "created", "keep": "kept existing"}[status]
            click.echo(f"{verb:>14}  {directory / rel}")

    run(action)


@cli.command()
@global_options
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: only on a terminal).")
def index(progress: bool | None, **kwargs: Any) -> None:
    """Sync the index with the workspace once (incremental)."""
    ctx = ctx_of(kwargs)
    run(lambda: _index(ctx, progress, force=False))


@cli.command()
@global_options
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: only on a terminal).")
def reindex(progress: bool | None, **kwargs: Any) -> None:
    """Rebuild the whole index; the old one keeps serving until the new one is complete."""
    ctx = ctx_of(kwargs)
    run(lambda: _index(ctx, progress, force=True))


@cli.command("take-over")
@global_options
def take_over(**kwargs: Any) -> None:
    """Make this folder the writer of its workspace in a shared index (after moving it to this host)."""
    from clawmem_index.errors import ConfigError
    from clawmem_index.index.backends import PostgresBackend, backend_for

    ctx = ctx_of(kwargs)

    def action() -> None:
        backend = backend_for(ctx.settings())
        if not isinstance(backend, PostgresBackend):
            raise ConfigError("index_backend: take-over is for a shared index (index_backend = \"postgres\");"
                              " a SQLite index belongs to its folder already")
        backend.take_over()
        click.echo(f"this folder now writes {backend.describe()}; its next sync makes the rows its own")

    run(action)


@cli.command()
@click.argument("role")
@click.argument("workspace_name", metavar="WORKSPACE")
@click.option("--write", "writable", is_flag=True, help="Let ROLE write the workspace too (its agent's daemon).")
@click.option("--url", metavar="URL", help="The shared index, connected to as its owner [env CLAWMEM_INDEX_URL].")
def grant(role: str, workspace_name: str, writable: bool, url: str | None) -> None:
    """Let a PostgreSQL role read (or --write) one workspace of the shared index (run as the tables' owner).

    Creates the schema first if the database has none yet. See docs/postgres-setup.md.
    """
    from clawmem_index.config import workspace_id
    from clawmem_index.errors import ConfigError

    def action() -> None:
        import psycopg

        from clawmem_index.index.pg.connection import connect
        from clawmem_index.index.pg.schema import grant_workspace, migrate

        target = url or os.environ.get("CLAWMEM_INDEX_URL", "")
        if not target.startswith(("postgresql://", "postgres://")):
            raise ConfigError("grant needs the shared index's postgresql:// URL: --url or CLAWMEM_INDEX_URL")
        name = workspace_id(workspace_name)
        if not name:
            raise ConfigError(f"workspace {workspace_name!r} holds no letter or digit")
        if name != workspace_name:  # never grant a folded name: it may be another tenant's
            raise ConfigError(f"{workspace_name!r} is not a workspace name (lower-case ASCII letters, digits, '-', '_' "
                              f"and '.', at most 63): the shared index would read it as {name!r}; give that name if "
                              "it is the workspace meant")
        conn = connect(target)
        try:
            migrate(conn)
            grant_workspace(conn, role, name, writable=writable)
        except psycopg.Error as exc:
            raise IndexUnavailable(f"cannot grant {name!r} to {role!r}: {' '.join(str(exc).split())}") from exc
        finally:
            conn.close()
        click.echo(f"role {role} may now {'read and write' if writable else 'read'} workspace {name!r}")

    run(action)


def _index(ctx: Context, progress: bool | None, *, force: bool) -> None:
    client = ctx.daemon()
    if client is not None:
        _refuse_what_the_daemon_would_not_do(ctx, client, "reindex" if force else "index")
        _index_by_daemon(client, force=force)
        return
    memory = ctx.index()
    show = sys.stderr.isatty() if progress is None else progress
    try:
        with (_ProgressBar(show, "indexing", "files") as bar, _ProgressBar(show, "embedding", "chunks") as ebar,
              _ProgressBar(show, "clustering vectors", "vectors") as vbar):
            run = memory.reindex if force else memory.sync
            report = run(progress=bar.update, embed_progress=ebar.update, vectors_progress=vbar.update,
                         notify=lambda message: click.echo(f"clawmem: {message}", err=True))
        waiting = memory.reader().pending_embeddings() if report.embed_error else 0
    except KeyboardInterrupt:
        interrupted(_where_it_stopped(memory.rebuilding, force=force))
    finally:
        memory.close()
    _summary(f"indexed {memory.settings.workspace}", report.as_dict(), waiting)
    if memory.provider is None and memory.provider_note:
        click.echo(f"clawmem: note: {memory.provider_note}", err=True)


def _where_it_stopped(rebuilding: bool, *, force: bool) -> str:
    """What an interrupted `index`/`reindex` leaves, and how the next run goes on.

    A sync commits each file, and embedding each batch of vectors, as it is done: the next run does
    only the rest. A rebuild (or a switch of model) is written aside and put in place whole: stopped
    before that, the index in use is untouched and the work starts over.
    """
    if rebuilding:
        again = "`clawmem reindex` starts it again" if force else "the next `clawmem index` starts it again"
        return f"interrupted before the rebuilt index was put in place: the index in use is as it was; {again}"
    return ("interrupted: the files and vectors indexed so far are kept; the next `clawmem index` resumes where"
            " this one stopped")


def _summary(head: str, report: dict[str, Any], waiting: int = 0) -> None:
    """The one-line account of a whole run (embedding included), then what needs the user's eye."""
    parts = [f"{report.get('files_seen', 0)} files", f"{report.get('added', 0)} added",
             f"{report.get('updated', 0)} updated", f"{report.get('removed', 0)} removed",
             f"{report.get('chunks_added', 0)} chunks added"]
    if report.get("embedded"):
        parts.append(f"{report['embedded']} embedded")
    if report.get("from_cache"):
        parts.append(f"{report['from_cache']} vectors from the cache")
    click.echo(f"{head} in {float(report.get('duration') or 0.0):.2f}s: " + ", ".join(parts), err=True)
    for problem in [*report.get("errors", []), *report.get("skipped", [])]:
        click.echo(f"clawmem: warning: {problem}", err=True)
    for note in report.get("batch_notes", []):
        click.echo(f"clawmem: warning: batch job: {note}", err=True)
    if report.get("batch_jobs"):
        click.echo(f"clawmem: {report['batch_chunks']} chunks are being embedded by {report['batch_jobs']} batch"
                   " job(s) at the provider; the next `clawmem index`, or the daemon, collects them", err=True)
    if report.get("embed_error"):
        click.echo(f"clawmem: warning: {waiting or 'some'} chunks wait for a vector ({report['embed_error']});"
                   " the next `clawmem index`, or the daemon, completes them", err=True)
    if not report.get("files_seen"):
        click.echo("clawmem: warning: no memory files here (MEMORY.md, memory/**/*.md): is this the right"
                   " workspace? `clawmem init DIR` creates a starter one", err=True)


class _ProgressBar:
    """click's progress bar, created on the first update so an empty phase prints nothing.

    It redraws at most every REDRAW_SECONDS (and at the end), not once per file, and shows the
    measured rate and the time left only once there is enough to measure: a second of work. A count
    that starts again (another total, or fewer done: a rebuild's vectors from the old index, then from
    the cache, then the provider's) gets a bar of its own instead of running a finished one backwards.
    """

    REDRAW_SECONDS = 0.2
    MEASURE_SECONDS = 1.0

    def __init__(self, enabled: bool, label: str, unit: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled, self.label, self.unit = enabled, label, unit
        self._clock = clock
        self._bar: Any = None
        self._drawn = 0  # the count the bar shows
        self._total = 0
        self._started = self._last_draw = 0.0
        self.draws = 0

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        now = self._clock()
        if self._bar is not None and (total != self._total or done < self._drawn):
            self._bar.__exit__(None, None, None)
            self._bar, self._drawn = None, 0
        if self._bar is None:
            self._started = now
            self._bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_eta=False,
                                          item_show_func=self._status)
            self._bar.__enter__()
        elif done < total and now - self._last_draw < self.REDRAW_SECONDS:
            return
        self._total, self._last_draw = total, now
        self._bar.update(done - self._drawn, done)
        self._drawn = done
        self.draws += 1

    def _status(self, done: int | None) -> str | None:
        """`1,234 files/s, 0:42 left`, once a second of work gives a rate worth showing."""
        elapsed = self._clock() - self._started
        if not done or self._bar is None or elapsed < self.MEASURE_SECONDS:
            return None
        rate = done / elapsed
        left = max(0.0, (self._total - done) / rate) if self._total > done else 0.0
        minutes, seconds = divmod(int(left + 0.5), 60)
        return f"{rate:,.0f} {self.unit}/s, {minutes}:{seconds:02} left"


# -- a run handed to the daemon ---------------------------------------------------------------


def _refuse_what_the_daemon_would_not_do(ctx: Context, client: Any, command: str) -> None:
    """A run handed to the daemon is done with the daemon's index and provider: one asked for by name that
    differs is refused with the reason (the daemon holds the write lock, so it cannot run here either)."""
    from clawmem_index.api import daemon_differs
    from clawmem_index.errors import IndexBusy

    provider = ctx.flags["embedding.provider"]
    if provider in (None, "auto") and ctx.flags["index"] is None:
        return
    with client:
        status = client.status()
    differs = daemon_differs(status, ctx.settings(), index=ctx.flags["index"] is not None, provider=provider)
    if differs:
        pid = (status.get("daemon") or {}).get("pid")
        raise IndexBusy(f"the daemon of this workspace (pid {pid}) does its writes, and " + "; ".join(differs)
                        + f": stop it to run `clawmem {command}` with these options here, or run it without them")


def _index_by_daemon(client: Any, *, force: bool) -> None:
    """`index`/`reindex` while a daemon runs: it owns the writes, so ask it and wait for the run.

    Its embedding thread makes the vectors afterwards; `clawmem status` shows how many wait.
    """
    try:
        with client:
            run = client.reindex(wait=True) if force else client.sync(wait=True)
    except KeyboardInterrupt:
        interrupted("interrupted: stopped waiting; the daemon finishes the run (`clawmem status` shows how it went)")
    report = {**(run.get("report") or {}), "duration": run.get("duration")}
    _summary(f"the daemon {'rebuilt' if force else 'synced'} the index", report)
