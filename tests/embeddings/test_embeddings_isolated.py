"""The local model in a child process: same vectors, the model's memory outside the daemon, crashes survived."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.isolated import IsolatedProvider
from clawmem_index.embeddings.local import LocalProvider
from clawmem_index.errors import ProviderError
from tests.daemon_helpers import CLAWMEM, spawn_daemon, stop_process, wait_listening, wait_until


def isolated(model: Path) -> IsolatedProvider:
    inner = LocalProvider(EmbeddingSettings(), model)
    return IsolatedProvider(inner.info, functools.partial(LocalProvider, EmbeddingSettings(), model))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def model(local_provider: LocalProvider) -> Path:
    return local_provider.model_path


def test_the_child_gives_the_vectors_the_model_gives_in_process(model: Path, local_provider: LocalProvider) -> None:
    provider = isolated(model)
    try:
        texts = ["the staging server moved to fra-2", "a second, longer text " * 80]
        for got, want in zip(provider.embed_documents(texts), local_provider.embed_documents(texts), strict=True):
            assert got == pytest.approx(want, abs=1e-6)
        assert provider.embed_query("staging") == pytest.approx(local_provider.embed_query("staging"), abs=1e-6)
        assert provider.info == local_provider.info
        assert provider.embed_documents([]) == []
    finally:
        provider.close()


def test_the_model_is_loaded_in_the_child_not_in_the_caller(model: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import json, sys
        from tests.embeddings.test_embeddings_isolated import isolated
        from pathlib import Path
        provider = isolated(Path({str(model)!r}))
        provider.embed_query("hello")
        print(json.dumps({{"child": provider.pid, "llama_cpp_here": "llama_cpp" in sys.modules,
                          "model_mapped_here": {str(model)!r} in open("/proc/self/maps").read()}}))
        sys.stdout.flush()
        child_maps = open(f"/proc/{{provider.pid}}/maps").read()
        print(json.dumps({{"model_mapped_in_child": {str(model)!r} in child_maps}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout.splitlines()
    first, second = json.loads(out[0]), json.loads(out[1])
    assert first["child"] != os.getpid() and first["child"] is not None
    assert first["llama_cpp_here"] is False and first["model_mapped_here"] is False
    assert second["model_mapped_in_child"] is True


def test_a_killed_model_process_is_restarted_within_the_call(model: Path) -> None:
    provider = isolated(model)
    try:
        before = provider.embed_query("first")
        pid = provider.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid), message="the model process gone")
        assert provider.embed_query("first") == pytest.approx(before, abs=1e-6)
        assert provider.restarts == 1 and provider.pid not in (None, pid)
    finally:
        provider.close()
    assert provider.pid is None
    with pytest.raises(ProviderError, match="released"):  # closed for good: no second process
        provider.embed_query("after close")
    assert provider.pid is None


def test_a_child_that_dies_at_once_every_time_is_a_provider_error(model: Path) -> None:
    provider = IsolatedProvider(LocalProvider(EmbeddingSettings(), model).info, functools.partial(os._exit, 3))
    with pytest.raises(ProviderError, match=r"model process ended \(exit code 3\) twice"):
        provider.embed_query("x")
    with pytest.raises(ProviderError):  # and the next call tries again rather than hanging
        provider.embed_documents(["y"])


def test_a_model_that_cannot_load_is_the_providers_own_error(model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model.read_bytes()[:4096])
    provider = IsolatedProvider(LocalProvider(EmbeddingSettings(), model).info,
                                functools.partial(LocalProvider, EmbeddingSettings(), broken))
    try:
        with pytest.raises(ProviderError, match="truncated GGUF header"):
            provider.embed_query("x")
        assert provider.pid is not None  # the child reported it and keeps serving
    finally:
        provider.close()


def test_the_model_process_ends_with_a_killed_caller(model: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tests.embeddings.test_embeddings_isolated import isolated
        provider = isolated(Path({str(model)!r}))
        provider.embed_query("hello")
        print(provider.pid, flush=True)
        time.sleep(600)
    """)
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert caller.stdout is not None
        child = int(caller.stdout.readline())
        assert alive(child)
        caller.kill()
        caller.wait(30)
        wait_until(lambda: not alive(child), timeout=30, message="the model process ended after its caller")
    finally:
        stop_process(caller)
        caller.stdout.close()  # type: ignore[union-attr]


def test_the_daemon_runs_the_local_model_in_a_child(model: Path, workspace: Path, tmp_path: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\n\n- The staging server is fra-2.\n", encoding="utf-8")
    sock, index = tmp_path / "d.sock", tmp_path / "index.sqlite"
    proc = spawn_daemon(workspace, sock, index, env={"CLAWMEM_PROVIDER": "local", "CLAWMEM_LOCAL_MODEL": str(model)})
    try:
        wait_listening(sock, proc, timeout=60)
        answer = subprocess.run([*CLAWMEM, "search", "--workspace", str(workspace), "--socket", str(sock),
                                 "--index", str(index), "--provider", "local", "--json", "--mode", "vector",
                                 "--min-score", "0", "which staging server"],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "CLAWMEM_LOCAL_MODEL": str(model)})
        assert answer.returncode == 0, answer.stderr
        assert json.loads(answer.stdout)["results"][0]["path"] == "MEMORY.md"
        def model_processes() -> list[str]:
            children = [pid for task in Path(f"/proc/{proc.pid}/task").iterdir()
                        for pid in (task / "children").read_text().split()]
            return [pid for pid in children if str(model) in Path(f"/proc/{pid}/maps").read_text()]

        mapped = wait_until(model_processes, timeout=60, message="a child process of the daemon with the model loaded")
        status = json.loads(subprocess.run([*CLAWMEM, "status", "--workspace", str(workspace), "--socket", str(sock),
                                            "--json"], capture_output=True, text=True, timeout=60, check=True).stdout)
        assert status["daemon"]["model_process"] == {"pid": int(mapped[0]), "restarts": 0}
        assert str(model) not in Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        assert stop_process(proc) == 0
    wait_until(lambda: not any(alive(int(pid)) for pid in mapped), message="the model process ended with the daemon")


def test_only_an_isolating_caller_gets_a_child(model: Path) -> None:
    from clawmem_index.embeddings.registry import resolve_provider

    local = EmbeddingSettings(provider="local", local_model=str(model))
    assert isinstance(resolve_provider(local, cache_dir=model.parent).provider, LocalProvider)
    assert isinstance(resolve_provider(local, cache_dir=model.parent, isolate_local=True).provider, IsolatedProvider)


def test_a_daemon_index_closes_its_model_process(model: Path, settings: Any) -> None:
    from dataclasses import replace

    from clawmem_index.engine.core import MemoryIndex

    on = replace(settings, embedding=replace(settings.embedding, provider="local", local_model=str(model)))
    index = MemoryIndex(on, isolate_local_model=on.embedding.isolate_local)
    provider = index.provider
    assert isinstance(provider, IsolatedProvider)
    provider.warm()
    pid = provider.pid
    assert pid is not None and alive(pid)
    index.close()
    assert not alive(pid)


def test_hostile_texts_get_vectors_or_a_provider_error_and_the_model_process_keeps_serving(model: Path) -> None:
    from tests.hostile import FIXED_TEXTS

    provider = isolated(model)
    try:
        for name, text in FIXED_TEXTS.items():
            if name == "huge line":
                text = text[:20_000]  # the splitting is the local provider's own (test_embeddings_local)
            try:
                vectors = provider.embed_documents([text, "a plain text"])
            except ProviderError:
                continue  # a defined error, not a dead child or a hang
            assert len(vectors) == 2 and all(len(v) == provider.info.dims for v in vectors), name
        assert len(provider.embed_query("still serving")) == provider.info.dims
        assert provider.restarts == 0
    finally:
        provider.close()


def test_a_query_waits_for_one_small_call_not_for_a_whole_indexing_batch(model: Path) -> None:
    import threading

    from clawmem_index.embeddings import isolated as module

    provider = isolated(model)
    texts = [f"note {i}: " + "the staging server moved to another rack and back again " * 35 for i in range(40)]
    assert len(module._groups(texts, module.CALL_CHARS)) == len(texts)  # each long text is its own call
    provider.warm()
    done = threading.Event()
    served: list[str] = []  # whose call the child served, in order (noted while the lock is held)

    class Queued(type(provider._lock)):  # type: ignore[misc]
        """The batch's first call, once it holds the lock, waits for the query to take its turn behind it:
        the race is settled by events, not by how busy the machine is."""

        def __enter__(self) -> None:
            super().__enter__()
            if threading.current_thread() is batch and not served:
                wait_until(lambda: self._next >= 2, 60, message="the query asking for its turn")

        def __exit__(self, *exc: object) -> None:
            served.append("batch" if threading.current_thread() is batch else "query")
            super().__exit__(*exc)

    provider._lock = Queued()
    batch = threading.Thread(target=lambda: (provider.embed_documents(texts), done.set()))
    batch.start()
    try:
        wait_until(lambda: provider._lock._next >= 1, 60, message="the batch taking the lock")
        assert len(provider.embed_query("which rack")) == provider.info.dims
        assert served[:2] == ["batch", "query"], "the query was answered only after more of the batch"
    finally:
        batch.join(120)
        provider.close()
    assert done.is_set() and served.count("batch") == len(texts)


def test_groups_keep_order_and_put_a_long_text_alone() -> None:
    from clawmem_index.embeddings.isolated import _groups

    assert _groups([], 10) == []
    assert _groups(["", ""], 10) == [["", ""]]
    assert _groups(["aaaa", "bbbb", "cccccccccccc", "d"], 10) == [["aaaa", "bbbb"], ["cccccccccccc"], ["d"]]


def test_a_reload_keeps_one_model_process(model: Path, workspace: Path, tmp_path: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\n\n- The staging server is fra-2.\n", encoding="utf-8")
    sock, index = tmp_path / "d.sock", tmp_path / "index.sqlite"
    config = workspace / "clawmem.toml"
    base = "[daemon]\ndebounce = 0.2\nmax_delay = 1.0\nrescan_interval = 0\n"
    config.write_text(base)
    proc = spawn_daemon(workspace, sock, index, env={"CLAWMEM_PROVIDER": "local", "CLAWMEM_LOCAL_MODEL": str(model)})

    def status() -> dict[str, Any]:
        return json.loads(subprocess.run([*CLAWMEM, "status", "--workspace", str(workspace), "--socket", str(sock),
                                          "--json"], capture_output=True, text=True, timeout=60, check=True).stdout)

    def model_process() -> dict[str, Any]:
        return status()["daemon"].get("model_process") or {}

    def children() -> set[int]:
        return {int(pid) for task in Path(f"/proc/{proc.pid}/task").iterdir()
                for pid in (task / "children").read_text().split() if alive(int(pid))}

    try:
        wait_listening(sock, proc, timeout=60)
        first = wait_until(lambda: model_process().get("pid"), timeout=60, message="the model process")
        config.write_text(base + "[search]\nmax_results = 3\n")  # not an embedding setting: same model
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: model_process().get("pid") == first and children() == {first}, timeout=30,
                   message="the same model process after a reload")
        # An embedding setting: a new model process. Here, as the first reload's sync still embeds.
        (workspace / "memory").mkdir(exist_ok=True)
        for i in range(30):
            (workspace / "memory" / f"2026-11-{1 + i % 28:02d}-{i}.md").write_text(f"# Day {i}\n\n- note {i}\n")
        config.write_text(base + "[embedding]\nthreads = 1\n")
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: not alive(first), timeout=30, message="the old model process ended")
        # A pass the reload cut short goes again at once, with the new provider (not after a failure's backoff).
        wait_until(lambda: status()["pending_embeddings"] == 0, timeout=20, message="every chunk with its vector")
        daemon = status()["daemon"]
        assert daemon["embedding_error"] is None and "embedding_progress" in daemon
        # The new one starts when first needed (lazily): here for a search's query vector.
        asked = subprocess.run([*CLAWMEM, "search", "--workspace", str(workspace), "--socket", str(sock), "--json",
                                "--mode", "vector", "--min-score", "0", "which staging server"],
                               capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0 and json.loads(asked.stdout)["mode"] == "vector", asked.stderr
        second = wait_until(lambda: model_process().get("pid"), timeout=60, message="a new model process")
        assert second != first
        wait_until(lambda: children() == {second}, timeout=30,
                   message="only the new model process: "
                           f"{[Path(f'/proc/{c}/cmdline').read_text() for c in children()]}")
    finally:
        assert stop_process(proc) == 0
