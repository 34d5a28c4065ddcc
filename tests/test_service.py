"""systemd units: rendered, verified by systemd-analyze, installed and removed."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from clawmem.cli import cli
from clawmem.errors import ConfigError
from clawmem.service import (
    MARKER,
    UNIT_NAMES,
    clawmem_command,
    install,
    install_spec,
    render,
    static_spec,
    systemd_quote,
    uninstall,
)

REPO_UNITS = Path(__file__).resolve().parent.parent / "systemd"
ANALYZE = shutil.which("systemd-analyze")
ESCAPE = shutil.which("systemd-escape")
needs_analyze = pytest.mark.skipif(ANALYZE is None or ESCAPE is None, reason="systemd-analyze is not installed")


def verify(unit_dir: Path, home: Path, *, instance_of: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze --user verify` on the three units, offline (no running manager needed)."""
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    escaped = subprocess.run([str(ESCAPE), "--path", str(instance_of)], capture_output=True, text=True,
                             check=True).stdout.strip()
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"}
    return subprocess.run([str(ANALYZE), "--user", "verify", str(unit_dir / "clawmem.service"),
                           str(unit_dir / "clawmem.socket"), str(unit_dir / f"clawmem@{escaped}.service")],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def write_units(units: dict[str, str], target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        (target / name).write_text(text)
    return target


@needs_analyze
@pytest.mark.parametrize("sandbox", [True, False])
def test_installed_units_pass_systemd_analyze_verify(tmp_path: Path, sandbox: bool) -> None:
    ws = tmp_path / "my workspace %d"  # spaces and a would-be specifier must survive quoting
    ws.mkdir()
    spec = install_spec(ws, socket_name="ws-0123456789ab.sock", sandbox=sandbox)
    units = write_units(render(spec), tmp_path / "units")
    out = verify(units, tmp_path, instance_of=ws)
    assert (out.returncode, out.stderr) == (0, "")


@needs_analyze
def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    units = render(install_spec(ws, socket_name="x.sock"))
    units["clawmem.service"] = units["clawmem.service"].replace("Type=notify", "Type=notify\nWatchdogSecs=5")
    out = verify(write_units(units, tmp_path / "units"), tmp_path, instance_of=ws)
    assert "WatchdogSecs" in out.stderr


@needs_analyze
def test_shipped_units_are_the_rendered_ones_and_pass_verify(tmp_path: Path) -> None:
    rendered = render(static_spec())
    assert {p.name: p.read_text() for p in REPO_UNITS.iterdir()} == rendered
    stub = tmp_path / ".local" / "bin" / "clawmem"  # what %h/.local/bin/clawmem resolves to for verify
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    out = verify(REPO_UNITS, tmp_path, instance_of=tmp_path / "ws")
    assert (out.returncode, out.stderr) == (0, "")


def test_the_units_say_what_the_daemon_supports() -> None:
    units = render(install_spec(Path("/home/u/ws"), socket_name="ws-abc.sock", command=["/opt/venv/bin/clawmem"]))
    service = units["clawmem.service"]
    assert "ExecStart=/opt/venv/bin/clawmem serve --workspace /home/u/ws" in service
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID",
                 "NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectSystem=strict", "PrivateUsers=yes",
                 "RuntimeDirectory=clawmem", "CacheDirectory=clawmem"):
        assert line in service
    assert "ListenStream=%t/clawmem/ws-abc.sock" in units["clawmem.socket"]
    assert "SocketMode=0600" in units["clawmem.socket"] and "DirectoryMode=0700" in units["clawmem.socket"]
    assert 'ExecStart=/opt/venv/bin/clawmem serve --workspace "%f"' in units["clawmem@.service"]
    assert all(text.startswith(MARKER) for text in units.values())
    bare = render(install_spec(Path("/w"), socket_name="w.sock", sandbox=False))["clawmem.service"]
    assert "ProtectSystem" not in bare and "PrivateUsers" not in bare and "NoNewPrivileges=yes" in bare


def test_explicit_socket_and_index_are_passed_and_writable() -> None:
    spec = install_spec(Path("/w"), socket_name="w.sock", socket=Path("/srv/run/c.sock"),
                        index=Path("/srv/data/i.sqlite"), command=["/bin/clawmem"])
    units = render(spec)
    assert "serve --workspace /w --socket /srv/run/c.sock --index /srv/data/i.sqlite" in units["clawmem.service"]
    assert "ReadWritePaths=/srv/run" in units["clawmem.service"]
    assert "ReadWritePaths=/srv/data" in units["clawmem.service"]
    assert "ListenStream=/srv/run/c.sock" in units["clawmem.socket"]


@pytest.mark.parametrize("raw, quoted", [
    ("/plain/path", "/plain/path"),
    ("/with space", '"/with space"'),
    ("100%", "100%%"),
    ("$HOME", "$$HOME"),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", "back\\\\slash"),
    ("", '""'),
    (";", '";"'),
])
def test_systemd_quote(raw: str, quoted: str) -> None:
    assert systemd_quote(raw) == quoted


def test_the_command_is_this_installations_clawmem() -> None:
    command = clawmem_command()
    assert Path(command[0]).is_absolute()
    assert os.access(command[0], os.X_OK)


def test_install_update_and_uninstall(tmp_path: Path) -> None:
    target = tmp_path / "units"
    units = render(install_spec(Path("/w"), socket_name="w.sock"))
    assert [s for _, s in install(units, target)] == ["created"] * 3
    assert [s for _, s in install(units, target)] == ["unchanged"] * 3
    changed = {**units, "clawmem.service": units["clawmem.service"].replace("RestartSec=2s", "RestartSec=3s")}
    assert [s for _, s in install(changed, target)] == ["updated", "unchanged", "unchanged"]
    (target / "other.service").write_text("[Unit]\n")
    assert sorted(p.name for p in uninstall(target)) == sorted(UNIT_NAMES)
    assert [p.name for p in target.iterdir()] == ["other.service"]


def test_a_unit_clawmem_did_not_write_is_kept_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "units"
    target.mkdir()
    (target / "clawmem.service").write_text("[Service]\nExecStart=/my/own\n")
    units = render(install_spec(Path("/w"), socket_name="w.sock"))
    with pytest.raises(ConfigError, match="not written by clawmem"):
        install(units, target)
    assert not (target / "clawmem.socket").exists()  # nothing half-installed
    install(units, target, force=True)
    assert (target / "clawmem.service").read_text() == units["clawmem.service"]
    (target / "clawmem.socket").write_text("mine\n")
    uninstall(target)
    assert (target / "clawmem.socket").read_text() == "mine\n"  # not ours: left alone


def test_cli_install_service(tmp_path: Path, workspace: Path) -> None:
    runner = CliRunner()
    target = tmp_path / "units"
    dry = runner.invoke(cli, ["install-service", "--workspace", str(workspace), "--dry-run", "--unit-dir",
                              str(target)], catch_exceptions=False)
    assert dry.exit_code == 0
    assert "# --- clawmem.service" in dry.stdout and f"--workspace {workspace}" in dry.stdout
    assert not target.exists()
    done = runner.invoke(cli, ["install-service", "--workspace", str(workspace), "--unit-dir", str(target)],
                         catch_exceptions=False)
    assert done.exit_code == 0 and "created" in done.stdout
    assert sorted(p.name for p in target.iterdir()) == sorted(UNIT_NAMES)
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o022 == 0 for p in target.iterdir())
    gone = runner.invoke(cli, ["uninstall-service", "--unit-dir", str(target)], catch_exceptions=False)
    assert gone.exit_code == 0 and list(target.iterdir()) == []


def test_cli_install_service_defaults_to_the_user_unit_dir(workspace: Path) -> None:
    out = CliRunner().invoke(cli, ["install-service", "--workspace", str(workspace)], catch_exceptions=False)
    assert out.exit_code == 0
    unit_dir = Path(os.environ["XDG_CONFIG_HOME"]) / "systemd" / "user"
    assert (unit_dir / "clawmem.service").is_file()
