"""What every `clawmem` command shares: the group, the global options, the settings context, and one way to end
(an error line and its exit code, 130 for a Ctrl-C)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from clawmem_index import __version__
from clawmem_index.errors import ClawmemError

if TYPE_CHECKING:
    from clawmem_index.api import Client

__all__ = ["EXIT_INTERRUPTED", "Context", "argument_text", "cli", "ctx_of", "fail", "global_options", "interrupted",
           "run"]


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
        from clawmem_index.engine.core import MemoryIndex

        return MemoryIndex(self.settings(**overrides))

    def client(self) -> Client:
        """Where queries go: a clawmem_index.api.Client (the daemon when its socket answers, else the index,
        read-only)."""
        from clawmem_index.api import Client

        client = Client(self.flags["workspace"], config=self.flags["config"], socket=self.flags["socket"],
                        index=self.flags["index"], provider=self.flags["embedding.provider"])
        click_context = click.get_current_context(silent=True)
        if click_context is not None:
            click_context.call_on_close(client.close)

            def note_what_differs() -> None:
                if client.daemon_differs:
                    click.echo(f"clawmem: note: {client.daemon_differs}", err=True)

            click_context.call_on_close(note_what_differs)
        return client

    def daemon(self, settings: Any = None) -> Any:
        """A connected DaemonClient when a daemon listens on this workspace's socket, else None."""
        from clawmem_index.service.client import find_daemon

        return find_daemon(settings if settings is not None else self.settings())


def argument_text(value: str) -> str:
    """A command-line word as text: bytes that are not UTF-8 (a shell passes them through) become U+FFFD."""
    return os.fsencode(value).decode("utf-8", "replace")


def global_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--workspace", "-w", metavar="DIR",
                     help="Workspace directory [env CLAWMEM_WORKSPACE; default: .]"),
        click.option("--index", metavar="PATH", help="Index file [env CLAWMEM_INDEX; default: under the cache dir]"),
        click.option("--socket", metavar="PATH", help="Daemon socket [env CLAWMEM_SOCKET]"),
        click.option("--config", metavar="FILE", help="TOML config file [default: WORKSPACE/clawmem.toml]"),
        click.option("--provider", metavar="NAME",
                     help="Embedding provider: auto|openai|gemini|voyage|local|none [env CLAWMEM_PROVIDER]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def ctx_of(kwargs: dict[str, Any]) -> Context:
    return Context(kwargs.pop("workspace"), kwargs.pop("index"), kwargs.pop("socket"), kwargs.pop("config"),
                   kwargs.pop("provider"))


def fail(exc: ClawmemError) -> NoReturn:
    _say(f"clawmem: error: {exc}")
    sys.exit(exc.exit_code)


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command a Ctrl-C stopped


def _own_stderr() -> int | None:
    try:
        return os.dup(2)  # taken at start: llama-cpp-python points fd 2 (and sys.stderr) at /dev/null as it loads
    except OSError:
        return None


_STDERR = _own_stderr()


def _say(line: str) -> None:
    """A last line on stderr, also while another thread's model load has silenced it (a Ctrl-C then said nothing)."""
    if getattr(sys.stderr, "name", None) == os.devnull and _STDERR is not None:
        os.write(_STDERR, (line + "\n").encode("utf-8", "replace"))
    else:
        click.echo(line, err=True)


def interrupted(message: str) -> NoReturn:
    """A Ctrl-C: one line saying what it left and what comes next, exit 130 (click's own is `Aborted!`, exit 1).

    A second Ctrl-C while the command winds up (the index closed, a local model's decode in flight
    waited for) is ignored: it would end it with a traceback, or under that decode (a crash).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _say(f"clawmem: {message}")
    sys.exit(EXIT_INTERRUPTED)


def run(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except ClawmemError as exc:
        fail(exc)
    except KeyboardInterrupt:
        interrupted("interrupted")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clawmem")
def cli() -> None:
    """Keep a SQLite search index in step with an agent's Markdown memory, and search it."""


