"""systemd units: one instance per workspace, escaped like systemd-escape, verified by systemd-analyze."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from daemon_helpers import short_dir, stop_process, wait_until

from clawmem_index.cli import cli
from clawmem_index.config import load_settings
from clawmem_index.errors import ConfigError
from clawmem_index.service.unit_files import (
    LEGACY_NAMES,
    ensure_env_file,
    env_file_path,
    install,
    installed_instances,
    uninstall,
    unit_states,
)
from clawmem_index.service.units import (
    DROPIN,
    MARKER,
    TEMPLATE_NAMES,
    clawmem_command,
    escape_path,
    instance_name,
    instance_spec,
    render_instance,
    render_templates,
    shipped_units,
    systemd_quote,
    unescape_path,
)

REPO_UNITS = Path(__file__).resolve().parents[2] / "systemd"
ANALYZE = shutil.which("systemd-analyze")
ESCAPE = shutil.which("systemd-escape")
ACTIVATE = shutil.which("systemd-socket-activate")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
needs_escape = pytest.mark.skipif(ESCAPE is None, reason="systemd-escape is not installed")


def verify(home: Path, *units: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze --user verify`, offline: no running manager needed, drop-ins beside the units are read."""
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"}
    return subprocess.run([str(ANALYZE), "--user", "verify", *map(str, units)], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def installed(workspace: Path, unit_dir: Path, *flags: str) -> Result:
    out = invoke("install-service", "--workspace", str(workspace), "--unit-dir", str(unit_dir), *flags)
    assert out.exit_code == 0, out.output
    return out


def instance_file(unit_dir: Path, workspace: Path, kind: str) -> str:
    """The instance's service drop-in, or its socket unit."""
    name = escape_path(workspace)
    return (unit_dir / (f"clawmem@{name}.service.d/{DROPIN}" if kind == "service" else f"clawmem@{name}.socket")
            ).read_text()


def setting(text: str, key: str) -> str:
    """The last (effective) value of `key` in a drop-in."""
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")][-1]


# -- instance names ------------------------------------------------------------------------------

ESCAPE_CASES = ["/", "/home/u/ws", "/home/u/my workspace", "/a-b/c_d/e.f:g", "/.hidden/x", "/x/.y/", "//a//b/./c/",
                "/tmp/über/日本", "/a\\b", "/100%/$HOME/'q'\"", "/~u/+@=,;", "/a\tb", "/-", "/a/.", "/."]


@needs_escape
@pytest.mark.parametrize("path", [*ESCAPE_CASES, os.fsdecode(b"/caf\xe9")])
def test_escape_path_is_systemd_escape(path: str) -> None:
    real = subprocess.run([str(ESCAPE), "--path", "--", os.fsencode(path)], capture_output=True, check=True)
    assert escape_path(path) == real.stdout.decode().strip()
    back = subprocess.run([str(ESCAPE), "--unescape", "--path", "--", real.stdout.strip()], capture_output=True,
                          check=True)
    assert os.fsencode(unescape_path(escape_path(path))) == back.stdout.rstrip(b"\n")


@needs_escape
@pytest.mark.parametrize("path", ["/a/../b", "/a/.."])
def test_paths_systemd_escape_refuses_are_refused(path: str) -> None:
    assert subprocess.run([str(ESCAPE), "--path", "--", path], capture_output=True, check=False).returncode != 0
    with pytest.raises(ValueError):
        escape_path(path)


def test_a_relative_workspace_is_refused() -> None:
    """systemd-escape warns that a relative path would not come back from %f; workspaces are absolute."""
    with pytest.raises(ValueError):
        escape_path("relative/ws")


def test_a_workspace_too_long_for_a_unit_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="too long"):
        instance_name(Path("/" + "x" * 250))


# -- the units ------------------------------------------------------------------------------------


def test_shipped_units_are_the_rendered_ones_and_generic() -> None:
    shipped = {p.name: p.read_text() for p in REPO_UNITS.iterdir()}
    assert shipped == shipped_units(), "regenerate systemd/ from clawmem_index.service.units.shipped_units()"
    assert sorted(shipped) == sorted(TEMPLATE_NAMES)
    for text in shipped.values():
        for user_specific in ("%h", "/home", "~", ".openclaw", ".local", "clawmem.sock", MARKER):
            assert user_specific not in text
    assert 'ExecStart=/usr/bin/env clawmem serve --workspace "%f"' in shipped["clawmem@.service"]


@needs_analyze
def test_shipped_units_pass_verify_as_shipped(tmp_path: Path) -> None:
    out = verify(tmp_path, REPO_UNITS / "clawmem@.service", REPO_UNITS / "clawmem@.socket")
    assert (out.returncode, out.stderr) == (0, "")


def test_the_templates_say_what_the_daemon_supports() -> None:
    units = render_templates("/opt/venv/bin/clawmem", marker=True)
    service, socket = units["clawmem@.service"], units["clawmem@.socket"]
    assert 'ExecStart=/opt/venv/bin/clawmem serve --workspace "%f"' in service
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID",
                 "NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectSystem=strict", "PrivateUsers=yes",
                 "RuntimeDirectory=clawmem", "CacheDirectory=clawmem", "EnvironmentFile=-%E/clawmem/env",
                 "UnsetEnvironment=CLAWMEM_WORKSPACE CLAWMEM_INDEX CLAWMEM_SOCKET"):
        assert line in service
    assert "SocketMode=0600" in socket and "DirectoryMode=0700" in socket and "Service=" not in socket
    assert all(text.startswith(MARKER) for text in units.values())


@needs_analyze
@pytest.mark.parametrize("sandbox", [True, False])
def test_an_installed_instance_passes_verify(tmp_path: Path, sandbox: bool) -> None:
    ws = tmp_path / "my workspace %d"  # spaces and a would-be specifier must survive quoting
    ws.mkdir()
    config = tmp_path / "c $x.toml"
    config.write_text("")
    settings = load_settings(workspace=ws, overrides={"index": str(tmp_path / "i $x" / "index.sqlite"),
                                                      "socket": str(tmp_path / "r %n" / "c.sock")})
    unit_dir = tmp_path / "units"
    instance = instance_spec(settings, provider="openai", model="text-embedding-3-large", config=config,
                             sandbox=sandbox)
    install({**render_templates(" ".join(map(systemd_quote, clawmem_command())), marker=True),
             **render_instance(instance)}, unit_dir)
    out = verify(tmp_path, unit_dir / instance.service, unit_dir / instance.socket)
    assert (out.returncode, out.stderr) == (0, "")


@needs_analyze
def test_verify_reads_the_instance_drop_ins(tmp_path: Path, workspace: Path) -> None:
    unit_dir = tmp_path / "units"
    instance = instance_spec(load_settings(workspace=workspace))
    files = {**render_templates("/bin/true", marker=True), **render_instance(instance)}
    files[f"{instance.service}.d/{DROPIN}"] += "WatchdogSecs=5\n"
    install(files, unit_dir)
    assert "WatchdogSecs" in verify(tmp_path, unit_dir / instance.service, unit_dir / instance.socket).stderr


# -- install-service ------------------------------------------------------------------------------


def test_two_workspaces_install_side_by_side(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units"
    one, two = tmp_path / "one", tmp_path / "two words"
    one.mkdir()
    two.mkdir()
    installed(one, unit_dir, "--provider", "openai")
    templates = {n: (unit_dir / n).read_text() for n in TEMPLATE_NAMES}
    installed(two, unit_dir, "--index", str(tmp_path / "two.sqlite"))
    assert {n: (unit_dir / n).read_text() for n in TEMPLATE_NAMES} == templates
    assert [i.workspace for i in installed_instances(unit_dir)] == [one, two]
    first, second = instance_file(unit_dir, one, "service"), instance_file(unit_dir, two, "service")
    assert "--provider openai" in first and "--index" not in first
    assert "--index" in second and "--provider" not in second
    listens = {setting(instance_file(unit_dir, ws, "socket"), "ListenStream") for ws in (one, two)}
    assert len(listens) == 2
    assert sorted(p.name for p in unit_dir.iterdir()) == sorted([
        *TEMPLATE_NAMES, f"clawmem@{escape_path(one)}.service.d", f"clawmem@{escape_path(one)}.socket",
        f"clawmem@{escape_path(two)}.service.d", f"clawmem@{escape_path(two)}.socket"])


def test_every_install_flag_is_kept_for_that_instance(tmp_path: Path, workspace: Path) -> None:
    unit_dir = tmp_path / "units"
    config = tmp_path / "clawmem.toml"
    config.write_text("")
    index, sock = tmp_path / "data" / "i.sqlite", tmp_path / "run" / "c.sock"
    installed(workspace, unit_dir, "--provider", "gemini", "--model", "text-embedding-004", "--index", str(index),
              "--socket", str(sock), "--config", str(config), "--no-sandbox")
    exec_start = shlex.split(setting(instance_file(unit_dir, workspace, "service"), "ExecStart"))
    assert exec_start == ["/usr/bin/env", "CLAWMEM_MODEL=text-embedding-004", *clawmem_command(), "serve",
                          "--workspace", "%f", "--provider", "gemini", "--index", str(index), "--socket", str(sock),
                          "--config", str(config)]
    assert setting(instance_file(unit_dir, workspace, "socket"), "ListenStream") == str(sock)
    assert sock.parent.is_dir() and index.parent.is_dir()  # ReadWritePaths= needs them to exist


def test_model_is_set_on_the_command_line_so_it_outranks_the_env_file(tmp_path: Path, workspace: Path) -> None:
    """EnvironmentFile= overrides Environment=, so only the command line keeps --model for this instance."""
    unit_dir = tmp_path / "units"
    installed(workspace, unit_dir, "--model", "m-1")
    text = instance_file(unit_dir, workspace, "service")
    assert "Environment=CLAWMEM_MODEL" not in text
    assert setting(text, "ExecStart").startswith("/usr/bin/env CLAWMEM_MODEL=m-1 ")


def test_the_socket_unit_listens_where_clients_look(tmp_path: Path, workspace: Path) -> None:
    unit_dir = tmp_path / "units"
    installed(workspace, unit_dir)
    listen = setting(instance_file(unit_dir, workspace, "socket"), "ListenStream")
    assert listen.startswith("%t/")  # the user manager's runtime directory, which is the session's
    status = invoke("status", "--workspace", str(workspace), "--provider", "none", "--json")
    assert listen.replace("%t", os.environ["XDG_RUNTIME_DIR"]) == json.loads(status.stdout)["socket"]
    (workspace / "clawmem.toml").write_text(f'socket = "{tmp_path / "toml.sock"}"\n')
    installed(workspace, unit_dir)
    assert setting(instance_file(unit_dir, workspace, "socket"), "ListenStream") == str(tmp_path / "toml.sock")


def test_a_non_default_cache_dir_is_carried(tmp_path: Path, workspace: Path) -> None:
    """The index and the one-daemon lock live under XDG_CACHE_HOME: the daemon must use the CLI's."""
    settings = load_settings(workspace=workspace)
    instance = instance_spec(settings)
    assert instance.environment == (f"XDG_CACHE_HOME={os.environ['XDG_CACHE_HOME']}",)
    assert settings.cache_dir in instance.writable
    assert f"ReadWritePaths={settings.cache_dir}" in render_instance(instance)[f"{instance.service}.d/{DROPIN}"]


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short XDG_RUNTIME_DIR: socket paths must fit in sun_path."""
    for path in short_dir():
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
        yield path


def accepts_connections(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is not installed")
def test_clients_find_the_socket_activated_daemon(tmp_path: Path, workspace: Path, runtime_dir: Path) -> None:
    """What systemd would run, from the installed drop-ins: the socket it listens on, the ExecStart it starts."""
    unit_dir = tmp_path / "units"
    installed(workspace, unit_dir, "--provider", "none", "--no-sandbox")
    socket_unit, dropin = instance_file(unit_dir, workspace, "socket"), instance_file(unit_dir, workspace, "service")
    listen = Path(setting(socket_unit, "ListenStream").replace("%t", str(runtime_dir)))
    argv = shlex.split(setting(dropin, "ExecStart").replace("%f", str(workspace)))
    listen.parent.mkdir(mode=0o700)
    log = (tmp_path / "daemon.log").open("wb")
    passed = [arg for name in ("HOME", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME") for arg in ("-E", name)]
    proc = subprocess.Popen([str(ACTIVATE), "-l", str(listen), *passed, *argv], stdout=log, stderr=log)
    try:
        # The socket file appears at bind(), a moment before listen(): wait until a connection is taken.
        wait_until(lambda: accepts_connections(listen), timeout=15,
                   message=f"systemd-socket-activate listening on {listen}")
        status = invoke("status", "--workspace", str(workspace), "--json")
        assert status.exit_code == 0, (status.output, (tmp_path / "daemon.log").read_text())
        daemon = json.loads(status.stdout)["daemon"]
        assert daemon["socket_activated"] is True and daemon["socket"] == str(listen)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)
        log.close()


def test_cli_install_service_dry_run_writes_nothing(tmp_path: Path, workspace: Path) -> None:
    target = tmp_path / "units"
    dry = installed(workspace, target, "--dry-run")
    name = escape_path(workspace)
    for rel in (*TEMPLATE_NAMES, f"clawmem@{name}.service.d/{DROPIN}", f"clawmem@{name}.socket"):
        assert f"# --- {target / rel}" in dry.stdout
    assert f"# --- {env_file_path()}: created" in dry.stdout
    assert not target.exists() and not env_file_path().exists()


def test_cli_install_service_prints_the_commands_to_run(tmp_path: Path) -> None:
    ws = tmp_path / "a b"
    ws.mkdir()
    target = tmp_path / "units"
    out = installed(ws, target)
    service = f"clawmem@{escape_path(ws)}.service"
    assert f"systemctl --user enable --now {shlex.quote(service)}\n" in out.stdout
    assert f"systemctl --user enable --now {shlex.quote(service[:-len('service')] + 'socket')}\n" in out.stdout
    assert "systemctl --user daemon-reload\n" in out.stdout
    assert shlex.split(shlex.quote(service)) == [service]  # the backslashes of \x20 survive the shell
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o022 == 0 for p in target.rglob("*") if p.is_file())
    again = installed(ws, target, "--provider", "none")
    assert "updated" in again.stdout and f"systemctl --user restart {shlex.quote(service)}" in again.stdout


def test_cli_install_service_defaults_to_the_user_unit_dir(workspace: Path) -> None:
    out = invoke("install-service", "--workspace", str(workspace))
    assert out.exit_code == 0
    unit_dir = Path(os.environ["XDG_CONFIG_HOME"]) / "systemd" / "user"
    assert [i.workspace for i in installed_instances(unit_dir)] == [workspace]


def test_a_file_clawmem_did_not_write_is_kept_unless_forced(tmp_path: Path, workspace: Path) -> None:
    target = tmp_path / "units"
    mine = target / f"clawmem@{escape_path(workspace)}.socket"
    target.mkdir()
    mine.write_text("[Socket]\n")
    out = CliRunner().invoke(cli, ["install-service", "-w", str(workspace), "--unit-dir", str(target)])
    assert out.exit_code != 0 and "--force" in out.output
    assert not (target / "clawmem@.service").exists()  # nothing half-installed
    installed(workspace, target, "--force")
    assert MARKER in mine.read_text()


def test_no_sandbox_is_for_that_instance_only(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    installed(one, unit_dir, "--no-sandbox")
    installed(two, unit_dir)
    assert "PrivateUsers=yes" in (unit_dir / "clawmem@.service").read_text()
    assert setting(instance_file(unit_dir, one, "service"), "ProtectSystem") == "no"
    assert "PrivateUsers" not in instance_file(unit_dir, two, "service")


def test_install_reports_created_unchanged_updated(tmp_path: Path) -> None:
    target = tmp_path / "units"
    files = {"a.service": "x\n", "b.service.d/c.conf": MARKER + "\n"}
    old = os.umask(0)
    try:
        assert [s for _, s in install(files, target)] == ["created", "created"]
    finally:
        os.umask(old)
    assert stat.S_IMODE((target / "a.service").stat().st_mode) == 0o644
    assert [s for _, s in install(files, target)] == ["unchanged", "unchanged"]
    assert [s for _, s in install({**files, "b.service.d/c.conf": MARKER + "\ny\n"}, target)] == ["unchanged",
                                                                                                 "updated"]


# -- the environment file -------------------------------------------------------------------------


def test_the_env_file_is_private_whatever_the_umask(tmp_path: Path, workspace: Path) -> None:
    old = os.umask(0)
    try:
        installed(workspace, tmp_path / "units")
    finally:
        os.umask(old)
    env = env_file_path()
    assert env == Path(os.environ["XDG_CONFIG_HOME"]) / "clawmem" / "env"  # what %E/clawmem/env names
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    text = env.read_text()
    for key in ("OPENAI_API_KEY", "GEMINI_API_KEY", "VOYAGE_API_KEY", "CLAWMEM_PROVIDER", "CLAWMEM_MODEL"):
        assert f"\n#{key}=" in text
    assert all(line.startswith("#") or not line for line in text.splitlines())


def test_the_env_file_is_never_overwritten_only_tightened(tmp_path: Path) -> None:
    env = tmp_path / "clawmem" / "env"
    env.parent.mkdir()
    env.write_text("OPENAI_API_KEY=sk-mine\n")
    env.chmod(0o644)
    assert ensure_env_file(env, dry_run=True) == "tightened" and stat.S_IMODE(env.stat().st_mode) == 0o644
    assert ensure_env_file(env) == "tightened"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600 and env.read_text() == "OPENAI_API_KEY=sk-mine\n"
    assert ensure_env_file(env) == "unchanged"


# -- uninstall-service ----------------------------------------------------------------------------


def test_uninstall_removes_only_that_instance_and_the_templates_with_the_last(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    installed(one, unit_dir)
    installed(two, unit_dir)
    own = unit_dir / f"clawmem@{escape_path(one)}.service.d" / "override.conf"
    own.write_text("[Service]\nNice=5\n")  # the user's own drop-in: not ours to remove
    gone = invoke("uninstall-service", "--workspace", str(one), "--unit-dir", str(unit_dir))
    assert gone.exit_code == 0 and gone.stdout.count("removed") == 2
    assert own.exists() and all((unit_dir / n).exists() for n in TEMPLATE_NAMES)
    assert [i.workspace for i in installed_instances(unit_dir)] == [two]
    assert "still used by" in gone.stderr
    invoke("uninstall-service", "--workspace", str(two), "--unit-dir", str(unit_dir))
    assert sorted(p.relative_to(unit_dir) for p in unit_dir.rglob("*")) == [own.parent.relative_to(unit_dir),
                                                                            own.relative_to(unit_dir)]


def test_uninstall_without_workspace_removes_the_legacy_units(tmp_path: Path, workspace: Path) -> None:
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for name in LEGACY_NAMES:
        (unit_dir / name).write_text(f"{MARKER}\n[Unit]\n")
    (unit_dir / "other.service").write_text("[Unit]\n")
    installed(workspace, unit_dir)
    removed, users = uninstall(unit_dir)
    assert sorted(p.name for p in removed) == sorted(LEGACY_NAMES)  # the templates serve an instance
    assert users == [f"clawmem@{escape_path(workspace)}.service"]
    invoke("uninstall-service", "--workspace", str(workspace), "--unit-dir", str(unit_dir))
    assert [p.name for p in unit_dir.iterdir()] == ["other.service"]
    (unit_dir / "clawmem.service").write_text("mine\n")
    assert uninstall(unit_dir) == ([], []) and (unit_dir / "clawmem.service").exists()


def test_templates_stay_while_an_instance_is_still_enabled(tmp_path: Path, workspace: Path) -> None:
    unit_dir = tmp_path / "units"
    installed(workspace, unit_dir)
    service = f"clawmem@{escape_path(workspace)}.service"
    wants = unit_dir / "default.target.wants"
    wants.mkdir()
    (wants / service).symlink_to(unit_dir / "clawmem@.service")
    out = invoke("uninstall-service", "--workspace", str(workspace), "--unit-dir", str(unit_dir))
    assert f"disable --now {shlex.quote(service)}" in out.stderr
    assert all((unit_dir / n).exists() for n in TEMPLATE_NAMES)
    (wants / service).unlink()
    invoke("uninstall-service", "--workspace", str(workspace), "--unit-dir", str(unit_dir))
    assert not any((unit_dir / n).exists() for n in TEMPLATE_NAMES)


# -- services -------------------------------------------------------------------------------------

FAKE_SYSTEMCTL = """#!/bin/sh
printf '%s\\n' "$@" > "$0.args"
for unit in "$@"; do
  case "$unit" in
    *.service) printf 'Id=%s\\nActiveState=active\\nUnitFileState=enabled\\n\\n' "$unit" ;;
    *.socket) printf 'ActiveState=inactive\\nUnitFileState=disabled\\nId=%s\\n\\n' "$unit" ;;
  esac
done
"""


def fake_systemctl(bin_dir: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir.mkdir()
    exe = bin_dir / "systemctl"
    exe.write_text(script)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    return exe


def test_services_lists_instances_with_their_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unit_dir = tmp_path / "units"
    ws = tmp_path / "a b"
    ws.mkdir()
    installed(ws, unit_dir)
    exe = fake_systemctl(tmp_path / "bin", FAKE_SYSTEMCTL, monkeypatch)
    name = escape_path(ws)
    out = invoke("services", "--unit-dir", str(unit_dir), "--json")
    assert json.loads(out.stdout) == [
        {"workspace": str(ws), "unit": f"clawmem@{name}.service", "enabled": "enabled", "active": "active"},
        {"workspace": str(ws), "unit": f"clawmem@{name}.socket", "enabled": "disabled", "active": "inactive"},
    ]
    assert Path(f"{exe}.args").read_text().splitlines()[:2] == ["--user", "--no-pager"]
    table = [re.split(r"\s{2,}", line) for line in invoke("services", "--unit-dir", str(unit_dir)).stdout.splitlines()]
    assert table == [["WORKSPACE", "UNIT", "ENABLED", "ACTIVE"],
                     [str(ws), f"clawmem@{name}.service", "enabled", "active"],
                     [str(ws), f"clawmem@{name}.socket", "disabled", "inactive"]]


@pytest.mark.parametrize("script", [None, "#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n"])
def test_services_degrades_to_unknown_without_a_manager(tmp_path: Path, workspace: Path,
                                                        monkeypatch: pytest.MonkeyPatch, script: str | None) -> None:
    unit_dir = tmp_path / "units"
    installed(workspace, unit_dir)
    if script is None:
        (tmp_path / "empty").mkdir()
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    else:
        fake_systemctl(tmp_path / "bin", script, monkeypatch)
    out = invoke("services", "--unit-dir", str(unit_dir), "--json")
    assert out.exit_code == 0
    assert [(r["enabled"], r["active"]) for r in json.loads(out.stdout)] == [("unknown", "unknown")] * 2
    assert "unit states unknown" in out.stderr
    assert ("No medium found" if script else "not installed") in out.stderr


def test_services_with_nothing_installed(tmp_path: Path) -> None:
    out = invoke("services", "--unit-dir", str(tmp_path / "none"))
    assert out.exit_code == 0 and out.stdout == "" and "no clawmem instances" in out.stderr
    assert unit_states([]) in (({}, ""), (None, "systemctl is not installed"))


# -- quoting --------------------------------------------------------------------------------------


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


def test_a_path_a_unit_cannot_hold_is_refused(workspace: Path, tmp_path: Path) -> None:
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "a\nb" / "i.sqlite")})
    with pytest.raises(ConfigError, match="cannot be written"):
        instance_spec(settings)


def test_the_command_is_this_installations_clawmem() -> None:
    command = clawmem_command()
    assert Path(command[0]).is_absolute()
    assert os.access(command[0], os.X_OK)
