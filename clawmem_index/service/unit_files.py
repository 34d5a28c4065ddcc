"""The unit files in the user's unit directory: writing, finding and removing them, and asking systemd their state.

Everything `install-service` writes carries a marker line (`clawmem_index.service.units.MARKER`),
so `uninstall-service` only ever removes files it wrote. The text of the units is rendered by
`clawmem_index.service.units`.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clawmem_index.errors import ConfigError
from clawmem_index.service.units import DROPIN, MARKER, TEMPLATE_NAMES, instance_name, unescape_path

__all__ = ["ENV_FILE_TEXT", "LEGACY_NAMES", "InstalledInstance", "default_unit_dir", "enabled_units",
           "ensure_env_file", "env_file_path", "install", "installed_instances", "uninstall", "unit_states"]

LEGACY_NAMES = ("clawmem.service", "clawmem.socket")  # the single-workspace units of earlier versions

ENV_FILE_TEXT = """\
# Environment of clawmem's systemd units (their EnvironmentFile=): one NAME=value a line, no quotes
# needed. It holds API keys: keep it private (mode 0600). After editing, restart the daemons:
#   systemctl --user restart 'clawmem@*.service'
#
#OPENAI_API_KEY=sk-...
#OPENAI_BASE_URL=https://api.openai.com/v1
#GEMINI_API_KEY=...
#VOYAGE_API_KEY=...
#
# Defaults for every workspace; what was given to `clawmem install-service` wins for its instance:
#CLAWMEM_PROVIDER=auto
#CLAWMEM_MODEL=
#CLAWMEM_LOCAL_MODEL=
#CLAWMEM_FALLBACK=none
#CLAWMEM_LOG_LEVEL=info
#
# CLAWMEM_WORKSPACE, CLAWMEM_INDEX and CLAWMEM_SOCKET are ignored here: they would be the same for
# every workspace. Give --index/--socket to `clawmem install-service --workspace DIR` instead.
"""


# -- files ----------------------------------------------------------------------------------------


def default_unit_dir(environ: Mapping[str, str] = os.environ) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def env_file_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the units' EnvironmentFile= (%E/clawmem/env) points in a user manager."""
    config = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "clawmem" / "env"


def ensure_env_file(path: Path, *, dry_run: bool = False) -> str:
    """Create the keys file, private whatever the umask; never rewrite it, only tighten a loose mode.

    Returns "created", "tightened" or "unchanged" (what would happen, with `dry_run`).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        if not dry_run:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, ENV_FILE_TEXT.encode())
            finally:
                os.close(fd)
        return "created"
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is not a regular file")
    if st.st_mode & 0o077:
        if not dry_run:
            os.chmod(path, 0o600)
        return "tightened"
    return "unchanged"


def install(files: Mapping[str, str], unit_dir: Path, *, force: bool = False) -> list[tuple[Path, str]]:
    """Write the files (paths relative to `unit_dir`); returns (path, "created" | "updated" | "unchanged").

    A file that differs and was not written by us is left alone unless `force`; nothing is written
    unless every file can be.
    """
    planned: list[tuple[Path, str, str]] = []
    for rel, text in files.items():
        path = unit_dir / rel
        if not path.exists():
            planned.append((path, "created", text))
            continue
        current = path.read_text(encoding="utf-8", errors="replace")
        if current == text:
            planned.append((path, "unchanged", text))
        elif MARKER in current or force:
            planned.append((path, "updated", text))
        else:
            raise ConfigError(f"{path} exists and was not written by clawmem: use --force to replace it")
    for path, state, text in planned:
        if state != "unchanged":
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.chmod(0o644)  # whatever the umask: nobody else may write what this user's manager runs
            tmp.replace(path)
    return [(path, state) for path, state, _ in planned]


@dataclass(frozen=True)
class InstalledInstance:
    """An instance `install-service` set up: its files found in the unit directory."""

    name: str
    files: tuple[Path, ...]

    @property
    def workspace(self) -> Path:
        return unescape_path(self.name)

    @property
    def service(self) -> str:
        return f"clawmem@{self.name}.service"

    @property
    def socket(self) -> str:
        return f"clawmem@{self.name}.socket"


def installed_instances(unit_dir: Path) -> list[InstalledInstance]:
    """The instances whose service drop-in or socket unit carries our marker, by name."""
    found: dict[str, list[Path]] = {}
    try:
        entries = sorted(unit_dir.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        for suffix, path in ((".service.d", entry / DROPIN), (".socket", entry)):
            name = entry.name.removeprefix("clawmem@").removesuffix(suffix)
            if entry.name == f"clawmem@{name}{suffix}" and name and _ours(path):
                found.setdefault(name, []).append(path)
    return [InstalledInstance(name, tuple(paths)) for name, paths in sorted(found.items())]


def enabled_units(unit_dir: Path) -> list[str]:
    """clawmem units enabled in `unit_dir` (links in *.wants/, *.requires/): instances need the templates."""
    folders = [f for pattern in ("*.wants", "*.requires") for f in unit_dir.glob(pattern) if f.is_dir()]
    return sorted({link.name for folder in folders for link in folder.iterdir()
                   if link.name.startswith(("clawmem@", "clawmem.")) and link.name not in TEMPLATE_NAMES})


def uninstall(unit_dir: Path, workspace: Path | None = None) -> tuple[list[Path], list[str]]:
    """Remove one workspace's instance files, or else the legacy single units; then the templates if unused.

    Only files carrying our marker are removed. Returns what was removed and the instances that
    keep the templates in place (installed or still enabled).
    """
    removed: list[Path] = []
    if workspace is not None:
        name = instance_name(workspace)
        folder = unit_dir / f"clawmem@{name}.service.d"
        if _remove_ours(folder / DROPIN):
            removed.append(folder / DROPIN)
            if not any(folder.iterdir()):
                folder.rmdir()
        if _remove_ours(unit_dir / f"clawmem@{name}.socket"):
            removed.append(unit_dir / f"clawmem@{name}.socket")
    else:
        removed += [unit_dir / n for n in LEGACY_NAMES if _remove_ours(unit_dir / n)]
    enabled = {u for u in enabled_units(unit_dir) if u.startswith("clawmem@")}
    users = sorted({i.service for i in installed_instances(unit_dir)} | enabled)
    if not users:
        removed += [unit_dir / n for n in TEMPLATE_NAMES if _remove_ours(unit_dir / n)]
    return removed, users


def _ours(path: Path) -> bool:
    try:
        return MARKER in path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return False


def _remove_ours(path: Path) -> bool:
    if not _ours(path):
        return False
    path.unlink()
    return True


# -- the running manager --------------------------------------------------------------------------


def unit_states(units: Sequence[str], *, timeout: float = 10.0) -> tuple[dict[str, dict[str, str]] | None, str]:
    """Enabled and active state of each unit from `systemctl --user show`, or (None, why) without a manager.

    Outside a systemd session (containers, ssh without a user manager) systemctl cannot answer;
    that is a normal state for `clawmem services`, not an error.
    """
    exe = shutil.which("systemctl")
    if exe is None:
        return None, "systemctl is not installed"
    if not units:
        return {}, ""
    try:
        out = subprocess.run([exe, "--user", "--no-pager", "show", "--property=Id,UnitFileState,ActiveState",
                              "--", *units], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"systemctl --user failed: {exc}"
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return None, f"systemctl --user: {lines[-1] if lines else f'exit status {out.returncode}'}"
    states: dict[str, dict[str, str]] = {}
    for block in out.stdout.strip().split("\n\n"):
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            states[props["Id"]] = {"enabled": props.get("UnitFileState") or "-",
                                   "active": props.get("ActiveState") or "-"}
    return states, ""
