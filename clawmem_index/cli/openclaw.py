"""`clawmem import-openclaw`: print (or write) an OpenClaw agent's memory-search settings as clawmem settings.

The mapping is `openclaw_settings`, imported when the command runs: every `clawmem` start imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import click

from clawmem_index.cli.base import cli, run
from clawmem_index.errors import ConfigError


def _default_config(env: Mapping[str, str]) -> Path:
    if env.get("OPENCLAW_CONFIG_PATH"):
        return Path(env["OPENCLAW_CONFIG_PATH"]).expanduser()
    return Path(env.get("OPENCLAW_STATE_DIR") or Path.home() / ".openclaw").expanduser() / "openclaw.json"


@cli.command("import-openclaw")
@click.option("--openclaw-config", type=click.Path(dir_okay=False, path_type=Path),
              help="OpenClaw's config file [env OPENCLAW_CONFIG_PATH; default ~/.openclaw/openclaw.json].")
@click.option("--agent", help="The agent whose settings to carry (its own over the shared ones).")
@click.option("-w", "--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Where clawmem.toml goes with --write [default: the agent's OpenClaw workspace].")
@click.option("--write", is_flag=True, help="Create WORKSPACE/clawmem.toml (never overwrites one).")
def import_openclaw(openclaw_config: Path | None, agent: str | None, workspace: Path | None, write: bool) -> None:
    """Print OpenClaw's memory-search settings as clawmem settings, and say what could not be carried."""

    def action() -> None:
        from clawmem_index.cli.openclaw_settings import (
            agent_workspace,
            import_settings,
            includes,
            memory_search_settings,
            read_openclaw_config,
        )

        env = os.environ
        path = openclaw_config or _default_config(env)
        config = read_openclaw_config(path)
        imported = import_settings(memory_search_settings(config, agent), env)
        for where in includes(config):
            imported.notes.append(f"$include at {where} is not followed: settings in the files it names are not "
                                  "read; copy any memory-search settings from them by hand")
        text = imported.toml()
        target = (workspace or agent_workspace(config, agent, env)) / "clawmem.toml"
        click.echo(text, nl=False)
        for note in imported.notes:
            click.echo(f"clawmem: not carried as is: {note}", err=True)
        if not write:
            return
        try:
            with open(target, "x", encoding="utf-8") as out:
                out.write(f"# From OpenClaw's memory-search settings ({path.name}"
                          f"{', agent ' + agent if agent else ''}).\n{text}")
        except FileExistsError:
            raise ConfigError(f"{target} exists and is left as it is: add the lines above to it by hand") from None
        except OSError as exc:
            raise ConfigError(f"cannot write {target}: {exc.strerror or exc}") from None
        click.echo(f"clawmem: wrote {target}", err=True)

    run(action)
