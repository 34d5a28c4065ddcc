"""`clawmem` commands that serve: the daemon, the MCP server, and the systemd units that run them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from clawmem_index.cli.base import (
    argument_text,
    cli,
    ctx_of,
    global_options,
    run,
)


@cli.command()
@global_options
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              help="Log level [env CLAWMEM_LOG_LEVEL; default info].")
@click.option("--exit-when-idle", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Exit after this long without a request, a connection or work (daemon.exit_when_idle; 0: never).")
def serve(log_level: str | None, exit_when_idle: float | None, **kwargs: Any) -> None:
    """Run the daemon in the foreground: watch the workspace, keep the index current, answer on the socket.

    Logs are JSON lines when stderr is not a terminal. SIGTERM stops it (exit 0), SIGHUP reloads
    the configuration. systemd: Type=notify, watchdog and socket activation are supported.
    """
    ctx = ctx_of(kwargs)

    def action() -> None:
        from clawmem_index.service.daemon import run_daemon

        def load() -> Any:
            idle = {} if exit_when_idle is None else {"daemon.exit_when_idle": exit_when_idle}
            return ctx.settings(log_level=log_level, **idle)

        sys.exit(run_daemon(load(), reload_settings=load))

    run(action)


@cli.command()
@global_options
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
    ctx = ctx_of(kwargs)

    def action() -> None:
        from clawmem_index.mcp.http import load_token
        from clawmem_index.mcp.server import require_sdk, serve

        token = load_token(token_file) if http else None  # a bad token file stops it before anything else
        require_sdk()
        sys.exit(serve(ctx.client(), http=http, port=port or 0, token=token))

    run(action)


_UNIT_DIR_HELP = "Where the units are [default: $XDG_CONFIG_HOME/systemd/user]."


@cli.command("install-service")
@global_options
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
    ctx = ctx_of(kwargs)

    def action() -> None:
        import shlex

        from clawmem_index.service import unit_files, units

        settings = ctx.settings(**({"embedding.model": model} if model else {}))
        config = Path(ctx.flags["config"]).expanduser().resolve() if ctx.flags["config"] else None
        provider = settings.embedding.provider if ctx.flags["embedding.provider"] else None
        instance = units.instance_spec(settings, provider=provider, model=model, config=config,
                                         sandbox=not no_sandbox)
        command = " ".join(units.systemd_quote(w) for w in units.clawmem_command())
        files = {**units.render_templates(command, marker=True), **units.render_instance(instance)}
        target = unit_dir or unit_files.default_unit_dir()
        env_file = unit_files.env_file_path()
        for note in instance.notes:
            click.echo(f"clawmem: note: {note}", err=True)
        if dry_run:
            for rel, text in files.items():
                click.echo(f"# --- {target / rel}")
                click.echo(text)
            click.echo(f"# --- {env_file}: {unit_files.ensure_env_file(env_file, dry_run=True)} (mode 0600)")
            return
        states = unit_files.install(files, target, force=force)
        for path, state in states:
            click.echo(f"{state:>10}  {path}")
        for folder in instance.writable:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        click.echo(f"{unit_files.ensure_env_file(env_file):>10}  {env_file}  (mode 0600: put API keys here)")
        if any(units.MARKER in _read(target / n) for n in unit_files.LEGACY_NAMES):
            click.echo("clawmem: note: the single-workspace units of an earlier clawmem are installed too: "
                       "systemctl --user disable --now clawmem.service clawmem.socket && clawmem uninstall-service",
                       err=True)
        svc, sock = shlex.quote(instance.service), shlex.quote(instance.socket)
        click.echo("next, to run it now and at every login:")
        click.echo("  systemctl --user daemon-reload")
        click.echo(f"  systemctl --user enable --now {svc}")
        click.echo("or, to start it on the first query instead:")
        click.echo(f"  systemctl --user enable --now {sock}")
        mine = {target / rel for rel in units.render_instance(instance)}
        if any(state == "updated" and path in mine for path, state in states):
            click.echo(f"if it runs already: systemctl --user daemon-reload && systemctl --user restart {svc}")
        click.echo(f"logs: journalctl --user -u {svc} -f")

    run(action)


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

        from clawmem_index.service import unit_files, units

        target = unit_dir or unit_files.default_unit_dir()
        ws = Path(workspace).expanduser().resolve() if workspace is not None else None
        mine = ([f"clawmem@{units.instance_name(ws)}.{kind}" for kind in ("service", "socket")] if ws is not None
                else list(unit_files.LEGACY_NAMES))
        still = [u for u in unit_files.enabled_units(target) if u in mine]
        removed, users = unit_files.uninstall(target, ws)
        for path in removed:
            click.echo(f"   removed  {path}")
        if not removed:
            click.echo("no clawmem units to remove", err=True)
        if still:
            click.echo(f"clawmem: note: still enabled: systemctl --user disable --now {shlex.join(still)}", err=True)
        kept = [n for n in units.TEMPLATE_NAMES if units.MARKER in _read(target / n)]
        if kept and users:
            click.echo(f"kept {', '.join(kept)}: still used by {', '.join(users)}", err=True)
        if removed:
            click.echo("next: systemctl --user daemon-reload")

    run(action)


@cli.command("services")
@click.option("--unit-dir", type=click.Path(file_okay=False, path_type=Path), help=_UNIT_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def services(unit_dir: Path | None, as_json: bool) -> None:
    """List the workspaces with an installed daemon instance, and whether systemd enabled and runs them."""
    from clawmem_index.service import unit_files, units

    target = unit_dir or unit_files.default_unit_dir()
    instances = unit_files.installed_instances(target)
    states, why = unit_files.unit_states([u for i in instances for u in (i.service, i.socket)])
    rows = [{"workspace": argument_text(str(i.workspace)), "unit": unit,
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
    legacy = [n for n in unit_files.LEGACY_NAMES if units.MARKER in _read(target / n)]
    if legacy:
        click.echo(f"clawmem: note: single-workspace units of an earlier clawmem: {', '.join(legacy)}"
                   " (`clawmem uninstall-service` removes them)", err=True)
