"""The `clawmem` command: a thin layer that parses flags, calls the engine and formats answers.

Heavy modules (the engine, structlog, provider SDKs) are imported inside the commands so that
`clawmem search` starts fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from clawmem import __version__
from clawmem.errors import ClawmemError

__all__ = ["main"]


class Context:
    def __init__(self, workspace: str | None, index: str | None, socket: str | None, config: str | None,
                 provider: str | None) -> None:
        self.flags = {"workspace": workspace, "index": index, "socket": socket, "config": config,
                      "embedding.provider": provider}

    def settings(self, **overrides: Any) -> Any:
        from clawmem.config import load_settings

        flags = {k: v for k, v in self.flags.items() if k not in ("workspace", "config")}
        flags.update(overrides)
        return load_settings(workspace=self.flags["workspace"], config_file=self.flags["config"], overrides=flags)

    def index(self, **overrides: Any) -> Any:
        from clawmem.engine import MemoryIndex

        return MemoryIndex(self.settings(**overrides))

    def backend(self) -> Any:
        """Where queries go: the running daemon when its socket answers, else the index in-process.

        Both have the same search/get/status methods and answers.
        """
        settings = self.settings()
        backend = self.daemon(settings)
        if backend is None:
            from clawmem.engine import MemoryIndex

            backend = MemoryIndex(settings)
        click_context = click.get_current_context(silent=True)
        if click_context is not None:
            click_context.call_on_close(backend.close)
        return backend

    def daemon(self, settings: Any = None) -> Any:
        """A connected DaemonClient when a daemon listens on this workspace's socket, else None."""
        from clawmem.client import find_daemon

        return find_daemon(settings if settings is not None else self.settings())


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


def _run(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except ClawmemError as exc:
        _fail(exc)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clawmem")
def cli() -> None:
    """Keep a SQLite search index in step with an agent's Markdown memory, and search it."""


@cli.command()
@click.argument("directory", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Show what would be copied; write nothing.")
def init(directory: Path, dry_run: bool) -> None:
    """Create a starter workspace in DIRECTORY (never overwrites a file)."""
    from clawmem.template import copy_template

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


def _index(ctx: Context, progress: bool | None, *, force: bool) -> None:
    client = ctx.daemon()
    if client is not None:
        _index_by_daemon(client, force=force)
        return
    memory = ctx.index()
    show = sys.stderr.isatty() if progress is None else progress
    with _ProgressBar(show, "indexing") as bar, _ProgressBar(show, "embedding") as ebar:
        if force:
            report = memory.reindex(progress=bar.update)
        else:
            report = memory.sync(progress=bar.update, embed_progress=ebar.update)
    memory.close()
    parts = [f"{report.files_seen} files", f"{report.added} added", f"{report.updated} updated",
             f"{report.removed} removed", f"{report.chunks_added} chunks added"]
    if report.embedded:
        parts.append(f"{report.embedded} embedded")
    click.echo(f"indexed {memory.settings.workspace} in {report.duration:.2f}s: " + ", ".join(parts), err=True)
    for error in report.errors:
        click.echo(f"clawmem: warning: {error}", err=True)
    if report.embed_error:
        click.echo(f"clawmem: warning: embeddings pending: {report.embed_error}", err=True)


class _ProgressBar:
    """click's progress bar, created on the first update so an empty phase prints nothing."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled, self.label = enabled, label
        self._bar: Any = None
        self._done = 0

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        if self._bar is None:
            self._bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self._bar.__enter__()
        self._bar.update(done - self._done)
        self._done = done


@cli.command()
@_global_options
@click.argument("query", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the socket API's search object as JSON.")
@click.option("-n", "--max-results", type=click.IntRange(1, 1000), help="How many results (default 6).")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), help="Ranking mode (default hybrid).")
@click.option("--min-score", type=click.FloatRange(0.0, 1.0), help="Drop results scoring below this (default 0.3).")
@click.option("--path-prefix", metavar="PREFIX", help="Only results whose path starts with PREFIX.")
def search(query: tuple[str, ...], as_json: bool, max_results: int | None, mode: str | None,
           min_score: float | None, path_prefix: str | None, **kwargs: Any) -> None:
    """Search the memory for QUERY."""
    ctx = _ctx(kwargs)

    def action() -> None:
        from clawmem.search import SearchRequest

        request = SearchRequest(" ".join(query), max_results, min_score, mode, path_prefix)
        answer = ctx.backend().search(request)
        if as_json:
            click.echo(json.dumps(answer, ensure_ascii=False))
            return
        if answer.get("warning"):
            click.echo(f"clawmem: note: {answer['warning']}", err=True)
        results = answer["results"]
        if not results:
            click.echo("no results", err=True)
        for r in results:
            click.echo(click.style(f"{r['path']}:{r['start_line']}-{r['end_line']}", bold=True)
                       + f"  score {r['score']:.3f}")
            for line in str(r["snippet"]).splitlines()[:8]:
                click.echo(f"    {line}")
            click.echo("")

    _run(action)


@cli.command()
@_global_options
@click.argument("path")
@click.option("--from", "start", type=click.IntRange(min=1), help="First line to print (1-based).")
@click.option("--lines", type=click.IntRange(min=1), help="How many lines to print.")
def get(path: str, start: int | None, lines: int | None, **kwargs: Any) -> None:
    """Print a memory file, or a range of its lines."""
    ctx = _ctx(kwargs)

    def action() -> None:
        answer = ctx.backend().get(path, start, lines)
        text = str(answer["text"])
        click.echo(text)

    _run(action)


@cli.command()
@_global_options
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON.")
def status(as_json: bool, **kwargs: Any) -> None:
    """Show what is indexed, with which model, and how fresh it is."""
    ctx = _ctx(kwargs)

    def action() -> None:
        data = ctx.backend().status()
        if as_json:
            click.echo(json.dumps(data, ensure_ascii=False))
            return
        _print_fields(data)

    _run(action)


def _print_fields(data: dict[str, Any], indent: int = 0) -> None:
    """`key: value` lines, nested objects (the daemon's section) indented under their key."""
    for key, value in data.items():
        if key == "fingerprint":
            continue
        if isinstance(value, dict):
            click.echo(f"{'':>{indent}}{key}:")
            _print_fields(value, indent + 2)
        else:
            click.echo(f"{'':>{indent}}{key:<{22 - indent}} {value}")


def main() -> None:
    try:
        cli.main(prog_name="clawmem", standalone_mode=True)
    except ClawmemError as exc:  # pragma: no cover - commands map their own errors
        _fail(exc)


# -- the daemon and its service units ---------------------------------------------------------


def _index_by_daemon(client: Any, *, force: bool) -> None:
    """`index`/`reindex` while a daemon runs: it owns the writes, so ask it and wait for the run."""
    with client:
        run = client.reindex(wait=True) if force else client.sync(wait=True)
    report = run.get("report") or {}
    parts = [f"{report.get(k, 0)} {label}" for k, label in (
        ("files_seen", "files"), ("added", "added"), ("updated", "updated"), ("removed", "removed"),
        ("chunks_added", "chunks added"))]
    click.echo(f"the daemon {'rebuilt' if force else 'synced'} the index in {run.get('duration', 0.0):.2f}s: "
               + ", ".join(parts), err=True)
    for error in report.get("errors", []):
        click.echo(f"clawmem: warning: {error}", err=True)


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
        from clawmem.daemon import run_daemon

        def load() -> Any:
            return ctx.settings(log_level=log_level)

        sys.exit(run_daemon(load(), reload_settings=load))

    _run(action)


@cli.command("install-service")
@_global_options
@click.option("--dry-run", is_flag=True, help="Print the units; write nothing.")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write [default: $XDG_CONFIG_HOME/systemd/user].")
@click.option("--no-sandbox", is_flag=True,
              help="Leave out the namespace sandbox (for systems without unprivileged user namespaces).")
@click.option("--force", is_flag=True, help="Replace unit files that clawmem did not write.")
def install_service(dry_run: bool, unit_dir: Path | None, no_sandbox: bool, force: bool, **kwargs: Any) -> None:
    """Write systemd user units that run `clawmem serve` for this workspace."""
    ctx = _ctx(kwargs)

    def action() -> None:
        from clawmem import service

        settings = ctx.settings()
        spec = service.install_spec(
            settings.workspace, socket_name=settings.socket_path.name, socket=settings.socket,
            index=settings.index, config=Path(ctx.flags["config"]).resolve() if ctx.flags["config"] else None,
            sandbox=not no_sandbox)
        units = service.render(spec)
        if dry_run:
            for name, text in units.items():
                click.echo(f"# --- {name}")
                click.echo(text)
            return
        target = unit_dir or service.default_unit_dir()
        for path, state in service.install(units, target, force=force):
            click.echo(f"{state:>10}  {path}")
        click.echo("next: systemctl --user daemon-reload && systemctl --user enable --now clawmem.service"
                   "  (or clawmem.socket to start it on the first query)")

    _run(action)


@cli.command("uninstall-service")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the units are [default: $XDG_CONFIG_HOME/systemd/user].")
def uninstall_service(unit_dir: Path | None) -> None:
    """Remove the units `install-service` wrote (stop them first: systemctl --user disable --now clawmem)."""
    from clawmem import service

    removed = service.uninstall(unit_dir or service.default_unit_dir())
    for path in removed:
        click.echo(f"   removed  {path}")
    if not removed:
        click.echo("no clawmem units to remove", err=True)
