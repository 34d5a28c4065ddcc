"""The `clawmem` command: a thin layer that parses flags, calls the engine and formats answers.

Heavy modules (the engine, structlog, provider SDKs) are imported inside the commands so that
`clawmem search` starts fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from clawmem_index import __version__
from clawmem_index.errors import ClawmemError, IndexUnavailable

if TYPE_CHECKING:
    from clawmem_index.api import Client

__all__ = ["main"]


class Context:
    def __init__(self, workspace: str | None, index: str | None, socket: str | None, config: str | None,
                 provider: str | None) -> None:
        self.flags = {"workspace": workspace, "index": index, "socket": socket, "config": config,
                      "embedding.provider": provider}

    def settings(self, **overrides: Any) -> Any:
        """The settings, for an existing workspace folder (a typo must not look like an empty memory)."""
        from clawmem_index.config import check_workspace, load_settings

        flags = {k: v for k, v in self.flags.items() if k not in ("workspace", "config")}
        flags.update(overrides)
        settings = load_settings(workspace=self.flags["workspace"], config_file=self.flags["config"], overrides=flags)
        check_workspace(settings.workspace)
        return settings

    def index(self, **overrides: Any) -> Any:
        from clawmem_index.engine import MemoryIndex

        return MemoryIndex(self.settings(**overrides))

    def client(self) -> Client:
        """Where queries go: a clawmem_index.api.Client (the daemon when its socket answers, else the index read-only)."""
        from clawmem_index.api import Client

        client = Client(self.flags["workspace"], config=self.flags["config"], socket=self.flags["socket"],
                        index=self.flags["index"], provider=self.flags["embedding.provider"])
        click_context = click.get_current_context(silent=True)
        if click_context is not None:
            click_context.call_on_close(client.close)
            click_context.call_on_close(lambda: client.daemon_differs and click.echo(
                f"clawmem: note: {client.daemon_differs}", err=True))
        return client

    def daemon(self, settings: Any = None) -> Any:
        """A connected DaemonClient when a daemon listens on this workspace's socket, else None."""
        from clawmem_index.client import find_daemon

        return find_daemon(settings if settings is not None else self.settings())


def _argument(value: str) -> str:
    """A command-line word as text: bytes that are not UTF-8 (a shell passes them through) become U+FFFD."""
    return os.fsencode(value).decode("utf-8", "replace")


def _global_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--workspace", "-w", metavar="DIR", help="Workspace directory [env CLAWMEM_WORKSPACE; default: .]"),
        click.option("--index", metavar="PATH", help="Index file [env CLAWMEM_INDEX; default: under the cache dir]"),
        click.option("--socket", metavar="PATH", help="Daemon socket [env CLAWMEM_SOCKET]"),
        click.option("--config", metavar="FILE", help="TOML config file [default: WORKSPACE/clawmem.toml]"),
        click.option("--provider", metavar="NAME",
                     help="Embedding provider: auto|openai|gemini|voyage|local|none [env CLAWMEM_PROVIDER]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _ctx(kwargs: dict[str, Any]) -> Context:
    return Context(kwargs.pop("workspace"), kwargs.pop("index"), kwargs.pop("socket"), kwargs.pop("config"),
                   kwargs.pop("provider"))


def _fail(exc: ClawmemError) -> NoReturn:
    click.echo(f"clawmem: error: {exc}", err=True)
    sys.exit(exc.exit_code)


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command a Ctrl-C stopped


def _interrupted(message: str) -> NoReturn:
    """A Ctrl-C: one line saying what it left and what comes next, exit 130 (click's own is `Aborted!`, exit 1).

    A second Ctrl-C while the command winds up (the index closed, a local model's decode in flight
    waited for) is ignored: it would end it with a traceback, or under that decode (a crash).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    click.echo(f"clawmem: {message}", err=True)
    sys.exit(EXIT_INTERRUPTED)


def _run(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except ClawmemError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        _interrupted("interrupted")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clawmem")
def cli() -> None:
    """Keep a SQLite search index in step with an agent's Markdown memory, and search it."""


@cli.command()
@click.argument("directory", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Show what would be copied; write nothing.")
def init(directory: Path, dry_run: bool) -> None:
    """Create a starter workspace in DIRECTORY (never overwrites a file)."""
    from clawmem_index.template import copy_template

    def action() -> None:
        for rel, status in copy_template(directory, dry_run=dry_run):
            verb = {"create": "would create" if dry_run else "created", "keep": "kept existing"}[status]
            click.echo(f"{verb:>14}  {directory / rel}")

    _run(action)


@cli.command()
@_global_options
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: only on a terminal).")
def index(progress: bool | None, **kwargs: Any) -> None:
    """Sync the index with the workspace once (incremental)."""
    ctx = _ctx(kwargs)
    _run(lambda: _index(ctx, progress, force=False))


@cli.command()
@_global_options
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: only on a terminal).")
def reindex(progress: bool | None, **kwargs: Any) -> None:
    """Rebuild the whole index; the old one keeps serving until the new one is complete."""
    ctx = _ctx(kwargs)
    _run(lambda: _index(ctx, progress, force=True))


@cli.command("take-over")
@_global_options
def take_over(**kwargs: Any) -> None:
    """Make this folder the writer of its workspace in a shared index (after moving it to this host)."""
    from clawmem_index.backends import PostgresBackend, backend_for
    from clawmem_index.errors import ConfigError

    ctx = _ctx(kwargs)

    def action() -> None:
        backend = backend_for(ctx.settings())
        if not isinstance(backend, PostgresBackend):
            raise ConfigError("index_backend: take-over is for a shared index (index_backend = \"postgres\");"
                              " a SQLite index belongs to its folder already")
        backend.take_over()
        click.echo(f"this folder now writes {backend.describe()}; its next sync makes the rows its own")

    _run(action)


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

        from clawmem_index.pg.schema import grant_workspace, migrate
        from clawmem_index.pg.store import connect

        target = url or os.environ.get("CLAWMEM_INDEX_URL", "")
        if not target.startswith(("postgresql://", "postgres://")):
            raise ConfigError("grant needs the shared index's postgresql:// URL: --url or CLAWMEM_INDEX_URL")
        name = workspace_id(workspace_name)
        if not name:
            raise ConfigError(f"workspace {workspace_name!r} holds no letter or digit")
        conn = connect(target)
        try:
            migrate(conn)
            grant_workspace(conn, role, name, writable=writable)
        except psycopg.Error as exc:
            raise IndexUnavailable(f"cannot grant {name!r} to {role!r}: {' '.join(str(exc).split())}") from exc
        finally:
            conn.close()
        click.echo(f"role {role} may now {'read and write' if writable else 'read'} workspace {name!r}")

    _run(action)


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
        _interrupted(_where_it_stopped(memory.rebuilding, force=force))
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


@cli.command()
@_global_options
@click.argument("query", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the socket API's search object as JSON.")
@click.option("-n", "--max-results", type=click.IntRange(1, 1000), help="How many results (default 6).")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), help="Ranking mode (default hybrid).")
@click.option("--min-score", type=click.FloatRange(0.0, 1.0), help="Drop results scoring below this (default 0.2).")
@click.option("--path-prefix", metavar="PREFIX", help="Only results whose path starts with PREFIX.")
@click.option("--source", type=click.Choice(["memory", "sessions"]), help="Only memory files, or only transcripts.")
@click.option("--since", metavar="DATE", help="Only chunks dated on or after DATE (YYYY-MM-DD).")
@click.option("--before", metavar="DATE", help="Only chunks dated before DATE (YYYY-MM-DD).")
@click.option("--explain", is_flag=True, help="Say how each result got its place (keyword and vector rank and score,"
                                               " fused score, decay, MMR).")
@click.option("--workspace-set", metavar="NAMES", help="A shared index (index_backend postgres): search these"
                                                        " workspaces, comma-separated (e.g. alpha,beta).")
def search(query: tuple[str, ...], as_json: bool, max_results: int | None, mode: str | None,
           min_score: float | None, path_prefix: str | None, source: str | None, since: str | None,
           before: str | None, explain: bool, workspace_set: str | None, **kwargs: Any) -> None:
    """Search the memory for QUERY.

    Dated chunks are those of daily files (the YYYY-MM-DD in their name, or year/month/day folders:
    memory/2026/11/25.md) and of transcripts; a date bound leaves undated ones (MEMORY.md) out.
    """
    ctx = _ctx(kwargs)

    def action() -> None:
        answer = ctx.client().search(" ".join(map(_argument, query)), max_results=max_results, min_score=min_score,
                                     mode=mode, path_prefix=_argument(path_prefix) if path_prefix is not None else None,
                                     source=source, since=since, before=before, explain=explain,
                                     workspaces=_workspace_names(workspace_set))
        if as_json:
            click.echo(json.dumps(answer, ensure_ascii=False))
            return
        if answer.get("warning"):
            click.echo(f"clawmem: note: {answer['warning']}", err=True)
        _note_staleness(answer)
        results = answer["results"]
        if not results:
            click.echo("no results", err=True)
        _note_unreadable(answer)
        for r in results:
            where = f"{r['workspace']}:" if "workspace" in r and workspace_set else ""
            click.echo(click.style(f"{where}{r['path']}:{r['start_line']}-{r['end_line']}", bold=True)
                       + f"  score {r['score']:.3f}")
            if r.get("explain"):
                click.echo(f"    ({_explained(r['explain'])})")
            for line in str(r["snippet"]).splitlines()[:8]:
                click.echo(f"    {line}")
            click.echo("")

    _run(action)


def _workspace_names(workspace_set: str | None) -> list[str] | None:
    """`--workspace-set alpha,beta` as the names a shared index's search takes (None: this workspace)."""
    if not workspace_set:
        return None
    return [name.strip() for name in _argument(workspace_set).split(",") if name.strip()]


def _note_staleness(answer: dict[str, Any]) -> None:
    """Say on stderr what the answer does not cover yet (the JSON answer carries the same counts)."""
    from clawmem_index.api import coverage_notes

    for note in coverage_notes(answer):
        click.echo(f"clawmem: note: {note}", err=True)


def _note_unreadable(answer: dict[str, Any]) -> None:
    if answer.get("unreadable_workspaces"):
        click.echo("clawmem: note: not in the shared index or not readable here: "
                   + ", ".join(answer["unreadable_workspaces"]), err=True)


def _explained(how: dict[str, Any]) -> str:
    """`keyword #2 0.830, vector #5 0.612, weighted 0.693, decay x0.81, MMR #4 -> #2` for people."""
    parts = [f"{side} " + (f"#{how[f'{key}_rank']} {how[f'{key}_score']:.3f}" if how.get(f"{key}_rank") else "-")
             for side, key in (("keyword", "keyword"), ("vector", "vector"))]
    parts.append(f"{how['fusion']} {how['fused_score']:.3f}")
    if "decay_factor" in how:
        parts.append(f"decay x{how['decay_factor']:.2f}")
    if "mmr" in how:
        parts.append(f"MMR #{how['mmr']['place_before']} -> #{how['mmr']['place_after']}")
    return ", ".join(parts)


@cli.command()
@_global_options
@click.argument("path")
@click.option("--from", "start", type=click.IntRange(min=1), help="First line to print (1-based).")
@click.option("--lines", type=click.IntRange(min=1), help="How many lines to print.")
def get(path: str, start: int | None, lines: int | None, **kwargs: Any) -> None:
    """Print a memory file, or a range of its lines."""
    ctx = _ctx(kwargs)

    def action() -> None:
        from clawmem_index.errors import QueryError
        from clawmem_index.files import path_key

        client, key = ctx.client(), path_key(path)
        first, left = start or 1, lines
        while True:  # a large file comes in bounded pieces: print each, ask for the next
            answer = client.get(key, start=first, lines=left)
            if "file_lines" in answer:
                raise QueryError(f"{answer['path']} has {answer['file_lines']} line(s): --from {first} is past its"
                                 " end")
            text = str(answer["text"])
            if answer.get("lines"):
                click.echo(text)
            if not answer.get("truncated") or not answer.get("next_from"):
                return
            if left is not None:
                left -= int(answer["next_from"]) - first
                if left <= 0:
                    return
            first = int(answer["next_from"])

    _run(action)


@cli.command()
@_global_options
@click.argument("query", nargs=-1, required=True)
@click.option("--budget", type=click.IntRange(min=0), metavar="TOKENS",
              help="Most tokens the block may take (tiktoken, the index's tokenizer) [default 1500:"
                   " search.context_budget].")
@click.option("--json", "as_json", is_flag=True, help="Print the socket API's context object as JSON.")
@click.option("-n", "--max-results", type=click.IntRange(1, 1000), help="How many search results to draw on.")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), help="Ranking mode (default hybrid).")
@click.option("--min-score", type=click.FloatRange(0.0, 1.0), help="Leave out results scoring below this.")
@click.option("--path-prefix", metavar="PREFIX", help="Only files whose path starts with PREFIX.")
@click.option("--since", metavar="DATE", help="Only chunks dated on or after DATE (YYYY-MM-DD).")
@click.option("--before", metavar="DATE", help="Only chunks dated before DATE (YYYY-MM-DD).")
@click.option("--workspace-set", metavar="NAMES", help="A shared index (index_backend postgres): draw on these"
                                                        " workspaces, comma-separated (e.g. alpha,beta).")
def context(query: tuple[str, ...], budget: int | None, as_json: bool, max_results: int | None, mode: str | None,
            min_score: float | None, path_prefix: str | None, since: str | None, before: str | None,
            workspace_set: str | None, **kwargs: Any) -> None:
    """Print the memory block for a prompt: the best lines for QUERY, grouped by file, within a token budget.

    Each range is labelled `### PATH#LSTART-LEND`; whole lines only. Nothing is printed (and a note
    goes to stderr) when nothing matches or nothing fits.
    """
    ctx = _ctx(kwargs)

    def action() -> None:
        answer = ctx.client().context(" ".join(map(_argument, query)), budget=budget, max_results=max_results,
                                      min_score=min_score, mode=mode,
                                      path_prefix=_argument(path_prefix) if path_prefix is not None else None,
                                      since=since, before=before, workspaces=_workspace_names(workspace_set))
        if as_json:
            click.echo(json.dumps(answer, ensure_ascii=False))
            return
        if answer.get("warning"):
            click.echo(f"clawmem: note: {answer['warning']}", err=True)
        _note_staleness(answer)
        _note_unreadable(answer)
        if answer["text"]:
            click.echo(answer["text"])
        elif answer["hits"]:
            click.echo(f"nothing fits in {answer['budget']} tokens", err=True)
        else:
            click.echo("no results", err=True)

    _run(action)


# `status --check`: how fresh the index is, as the exit status (a health check need not parse JSON).
CHECK_FRESH, CHECK_NO_INDEX, CHECK_STALE, CHECK_BROKEN = 0, 3, 4, 5


@cli.command()
@_global_options
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON.")
@click.option("--check", is_flag=True,
              help="Exit 0 if fresh, 3 if there is no index, 4 if work is pending (it catches up by itself),"
                   " 5 if it cannot catch up (provider cannot start, last sync or embedding failed).")
def status(as_json: bool, check: bool, **kwargs: Any) -> None:
    """Show what is indexed, with which model, and how fresh it is."""
    ctx = _ctx(kwargs)

    def action() -> None:
        data = ctx.client().status()
        if as_json:
            click.echo(json.dumps(data, ensure_ascii=False))
        else:
            _print_fields(data)
        if check:
            sys.exit(freshness_code(data))

    _run(action)


def freshness_code(data: dict[str, Any]) -> int:
    """The `status --check` exit status of a status object."""
    if not data.get("index_exists", True):
        return CHECK_NO_INDEX
    daemon = data.get("daemon") or {}
    if (data.get("configured_provider") == "unavailable" or data.get("last_error")
            or daemon.get("last_error") or daemon.get("embedding_error")):
        return CHECK_BROKEN
    return CHECK_FRESH if data.get("fresh") else CHECK_STALE


def _print_fields(data: dict[str, Any], indent: int = 0) -> None:
    """`key value` lines for people: nested objects and lists indented under their key, "-" for nothing."""
    for key, value in data.items():
        if key in ("fingerprint", "last") or value in ([], {}):
            continue
        if isinstance(value, dict):
            click.echo(f"{'':>{indent}}{key}:")
            _print_fields(value, indent + 2)
        elif isinstance(value, list):
            click.echo(f"{'':>{indent}}{key}:")
            for item in value:
                click.echo(f"{'':>{indent + 2}}- {_plain(item)}")
        else:
            click.echo(f"{'':>{indent}}{key:<{22 - indent}} {_plain(value)}")


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items())
    return str(value)


def main() -> None:
    try:
        cli.main(prog_name="clawmem", standalone_mode=True)
    except ClawmemError as exc:  # pragma: no cover - commands map their own errors
        _fail(exc)


# -- the daemon and its service units ---------------------------------------------------------


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
        _interrupted("interrupted: stopped waiting; the daemon finishes the run (`clawmem status` shows how it went)")
    report = {**(run.get("report") or {}), "duration": run.get("duration")}
    _summary(f"the daemon {'rebuilt' if force else 'synced'} the index", report)


@cli.command()
@_global_options
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              help="Log level [env CLAWMEM_LOG_LEVEL; default info].")
def serve(log_level: str | None, **kwargs: Any) -> None:
    """Run the daemon in the foreground: watch the workspace, keep the index current, answer on the socket.

    Logs are JSON lines when stderr is not a terminal. SIGTERM stops it (exit 0), SIGHUP reloads
    the configuration. systemd: Type=notify, watchdog and socket activation are supported.
    """
    ctx = _ctx(kwargs)

    def action() -> None:
        from clawmem_index.daemon import run_daemon

        def load() -> Any:
            return ctx.settings(log_level=log_level)

        sys.exit(run_daemon(load(), reload_settings=load))

    _run(action)


@cli.command()
@_global_options
@click.option("--http", "http", is_flag=True, help="Serve Streamable HTTP on 127.0.0.1 instead of stdio.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port for --http (default 0: pick a free one; the URL is printed on stderr).")
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="File (0600) holding the bearer token --http requires: 16 to 4096 visible ASCII characters"
                   " [default: $XDG_CONFIG_HOME/clawmem/mcp-token, made on first use].")
def mcp(http: bool, port: int | None, token_file: Path | None, **kwargs: Any) -> None:
    """Serve the memory tools to agent hosts over MCP: memory_search, memory_get, memory_status, memory_context.

    stdio by default (what hosts such as Claude Desktop, Claude Code or Cursor launch). Queries go to
    the workspace's daemon when it answers, else to the index file, read-only. Needs the MCP SDK:
    pip install 'clawmem-index[mcp]'.
    """
    if not http and (port is not None or token_file is not None):
        raise click.UsageError("--port and --token-file are for --http (stdio needs neither)")
    ctx = _ctx(kwargs)

    def action() -> None:
        from clawmem_index.mcp_http import load_token
        from clawmem_index.mcp_server import require_sdk, serve

        token = load_token(token_file) if http else None  # a bad token file stops it before anything else
        require_sdk()
        sys.exit(serve(ctx.client(), http=http, port=port or 0, token=token))

    _run(action)


_UNIT_DIR_HELP = "Where the units are [default: $XDG_CONFIG_HOME/systemd/user]."


@cli.command("install-service")
@_global_options
@click.option("--model", metavar="NAME", help="Embedding model for this workspace's daemon [env CLAWMEM_MODEL].")
@click.option("--dry-run", is_flag=True, help="Print the units; write nothing.")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path), help=_UNIT_DIR_HELP)
@click.option("--no-sandbox", is_flag=True,
              help="Leave out the namespace sandbox (for systems without unprivileged user namespaces).")
@click.option("--force", is_flag=True, help="Replace unit files that clawmem did not write.")
def install_service(model: str | None, dry_run: bool, unit_dir: Path | None, no_sandbox: bool, force: bool,
                    **kwargs: Any) -> None:
    """Install a systemd user instance, clawmem@<escaped DIR>, that runs `clawmem serve` for this workspace.

    The shared templates clawmem@.service and clawmem@.socket are written once; this workspace's flags
    go into its instance's drop-in and its socket into its instance's socket unit, so workspaces never
    overwrite each other.
    """
    ctx = _ctx(kwargs)

    def action() -> None:
        import shlex

        from clawmem_index import service

        settings = ctx.settings(**({"embedding.model": model} if model else {}))
        config = Path(ctx.flags["config"]).expanduser().resolve() if ctx.flags["config"] else None
        provider = settings.embedding.provider if ctx.flags["embedding.provider"] else None
        instance = service.instance_spec(settings, provider=provider, model=model, config=config,
                                         sandbox=not no_sandbox)
        command = " ".join(service.systemd_quote(w) for w in service.clawmem_command())
        files = {**service.render_templates(command, marker=True), **service.render_instance(instance)}
        target = unit_dir or service.default_unit_dir()
        env_file = service.env_file_path()
        for note in instance.notes:
            click.echo(f"clawmem: note: {note}", err=True)
        if dry_run:
            for rel, text in files.items():
                click.echo(f"# --- {target / rel}")
                click.echo(text)
            click.echo(f"# --- {env_file}: {service.ensure_env_file(env_file, dry_run=True)} (mode 0600)")
            return
        states = service.install(files, target, force=force)
        for path, state in states:
            click.echo(f"{state:>10}  {path}")
        for folder in instance.writable:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        click.echo(f"{service.ensure_env_file(env_file):>10}  {env_file}  (mode 0600: put API keys here)")
        if any(service.MARKER in _read(target / n) for n in service.LEGACY_NAMES):
            click.echo("clawmem: note: the single-workspace units of an earlier clawmem are installed too: "
                       "systemctl --user disable --now clawmem.service clawmem.socket && clawmem uninstall-service",
                       err=True)
        svc, sock = shlex.quote(instance.service), shlex.quote(instance.socket)
        click.echo("next, to run it now and at every login:")
        click.echo("  systemctl --user daemon-reload")
        click.echo(f"  systemctl --user enable --now {svc}")
        click.echo("or, to start it on the first query instead:")
        click.echo(f"  systemctl --user enable --now {sock}")
        mine = {target / rel for rel in service.render_instance(instance)}
        if any(state == "updated" and path in mine for path, state in states):
            click.echo(f"if it runs already: systemctl --user daemon-reload && systemctl --user restart {svc}")
        click.echo(f"logs: journalctl --user -u {svc} -f")

    _run(action)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@cli.command("uninstall-service")
@click.option("--workspace", "-w", metavar="DIR",
              help="Remove this workspace's instance [default: the single-workspace units of earlier versions].")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path), help=_UNIT_DIR_HELP)
def uninstall_service(workspace: str | None, unit_dir: Path | None) -> None:
    """Remove what `install-service` wrote; the shared templates go with the last instance.

    Stop the daemon first: systemctl --user disable --now clawmem@<escaped DIR>.service (and .socket).
    """

    def action() -> None:
        import shlex

        from clawmem_index import service

        target = unit_dir or service.default_unit_dir()
        ws = Path(workspace).expanduser().resolve() if workspace is not None else None
        mine = ([f"clawmem@{service.instance_name(ws)}.{kind}" for kind in ("service", "socket")] if ws is not None
                else list(service.LEGACY_NAMES))
        still = [u for u in service.enabled_units(target) if u in mine]
        removed, users = service.uninstall(target, ws)
        for path in removed:
            click.echo(f"   removed  {path}")
        if not removed:
            click.echo("no clawmem units to remove", err=True)
        if still:
            click.echo(f"clawmem: note: still enabled: systemctl --user disable --now {shlex.join(still)}", err=True)
        kept = [n for n in service.TEMPLATE_NAMES if service.MARKER in _read(target / n)]
        if kept and users:
            click.echo(f"kept {', '.join(kept)}: still used by {', '.join(users)}", err=True)
        if removed:
            click.echo("next: systemctl --user daemon-reload")

    _run(action)


@cli.command("services")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path), help=_UNIT_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def services(unit_dir: Path | None, as_json: bool) -> None:
    """List the workspaces with an installed daemon instance, and whether systemd enabled and runs them."""
    from clawmem_index import service

    target = unit_dir or service.default_unit_dir()
    instances = service.installed_instances(target)
    states, why = service.unit_states([u for i in instances for u in (i.service, i.socket)])
    rows = [{"workspace": _argument(str(i.workspace)), "unit": unit,
             **((states or {}).get(unit) or {"enabled": "unknown", "active": "unknown"})}
            for i in instances for unit in (i.service, i.socket)]
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False))
    elif rows:
        header = {"workspace": "WORKSPACE", "unit": "UNIT", "enabled": "ENABLED", "active": "ACTIVE"}
        widths = {k: max(len(r[k]) for r in [header, *rows]) for k in header}
        for row in [header, *rows]:
            click.echo("  ".join(row[k].ljust(widths[k]) for k in header).rstrip())
    if not instances:
        click.echo(f"no clawmem instances installed in {target}", err=True)
    if states is None and instances:
        click.echo(f"clawmem: note: unit states unknown: {why}", err=True)
    legacy = [n for n in service.LEGACY_NAMES if service.MARKER in _read(target / n)]
    if legacy:
        click.echo(f"clawmem: note: single-workspace units of an earlier clawmem: {', '.join(legacy)}"
                   " (`clawmem uninstall-service` removes them)", err=True)
