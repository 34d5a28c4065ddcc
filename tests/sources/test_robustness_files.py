"""Races between the file system and the readers: nothing swapped in may be followed, read or block.

A thread keeps swapping `memory/x.md` between a regular file, a symlink to a secret outside the
workspace and a FIFO (renamed into place, so each swap is atomic), and `memory/sub` between a real
folder and a symlink to an outside folder whose `secret.md` holds the secret, while the main thread
reads with `get` and `sync`. Seeded, bounded by iteration counts, stopped by an Event.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clawmem_index.config import Settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import PathError

SECRET = "zebra-quartz-7731-secret"
GETS = 4000
SYNCS = 300


@dataclass
class Swapper:
    workspace: Path
    outside: Path
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    swaps: int = 0
    error: Exception | None = None
    _sub_linked: bool = False

    @property
    def memory(self) -> Path:
        return self.workspace / "memory"

    def run(self) -> None:
        rng = random.Random(self.seed)
        moves: list[Callable[[], None]] = [self._x_regular, self._x_symlink, self._x_fifo, self._flip_sub]
        try:
            while not self.stop.is_set():
                rng.choice(moves)()
                self.swaps += 1
        except Exception as exc:  # noqa: BLE001 - surfaced by the test: a broken swapper would prove nothing
            self.error = exc

    def _place_x(self, make: Callable[[Path], object]) -> None:
        tmp = self.memory / ".x.tmp"
        make(tmp)
        os.rename(tmp, self.memory / "x.md")

    def _x_regular(self) -> None:
        self._place_x(lambda tmp: tmp.write_text("# X\nan ordinary inside note\n"))

    def _x_symlink(self) -> None:
        self._place_x(lambda tmp: os.symlink(self.outside / "secret.md", tmp))

    def _x_fifo(self) -> None:
        self._place_x(os.mkfifo)

    def _flip_sub(self) -> None:
        sub, parked = self.memory / "sub", self.memory / ".parked"
        if self._sub_linked:
            os.unlink(sub)
            os.rename(parked, sub)
        else:
            os.rename(sub, parked)
            os.symlink(self.outside, self.memory / ".link.tmp")
            os.rename(self.memory / ".link.tmp", sub)
        self._sub_linked = not self._sub_linked


@pytest.fixture(params=[1, 2], ids=lambda seed: f"seed{seed}")
def swapping(request: pytest.FixtureRequest, workspace: Path, tmp_path: Path) -> Iterator[Swapper]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Secret\n{SECRET}\n")
    (workspace / "memory" / "sub").mkdir()
    (workspace / "memory" / "sub" / "secret.md").write_text("# Sub\nthe inside file of the same name\n")
    (workspace / "memory" / "x.md").write_text("# X\nan ordinary inside note\n")
    (workspace / "memory" / "steady.md").write_text("# Steady\nalways here\n")
    swapper = Swapper(workspace, outside, request.param)
    thread = threading.Thread(target=swapper.run, name="swapper", daemon=True)
    thread.start()
    try:
        yield swapper
    finally:
        swapper.stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert swapper.error is None, swapper.error
    assert swapper.swaps > 0


def secret_rows(index: MemoryIndex) -> int:
    rows = index.reader().execute("SELECT count(*) FROM chunks WHERE text LIKE ?", (f"%{SECRET}%",))
    return int(rows[0][0])


@pytest.mark.timeout(60)
def test_get_never_follows_reads_or_blocks_on_what_is_swapped_in(swapping: Swapper, settings: Settings) -> None:
    rng = random.Random(swapping.seed)
    index = MemoryIndex(settings)
    outcomes = {"read": 0, "refused": 0}
    started = time.perf_counter()
    for i in range(GETS):
        path = ("memory/x.md", "memory/sub/secret.md")[i % 2]
        try:
            answer = index.get(path, rng.choice([None, 1, 2]), rng.choice([None, 1, 5]),
                               rng.choice([None, 8, 4096]))
        except PathError:
            outcomes["refused"] += 1
            continue
        assert SECRET not in str(answer["text"])
        outcomes["read"] += 1
    assert outcomes["read"] and outcomes["refused"], outcomes
    print(f"{GETS} gets in {time.perf_counter() - started:.2f}s, {swapping.swaps} swaps, {outcomes}")


@pytest.mark.timeout(60)
def test_sync_never_indexes_or_blocks_on_what_is_swapped_in(swapping: Swapper, settings: Settings) -> None:
    index = MemoryIndex(settings)
    started = time.perf_counter()
    reasons: set[str] = set()
    for i in range(SYNCS):
        paths = ["memory/x.md", "memory/sub/secret.md"] if i % 3 == 2 else None
        report = index.sync(paths=paths)
        reasons.update(s.split(": ", 1)[1] for s in report.skipped)
        assert secret_rows(index) == 0
        for path in ("memory/x.md", "memory/sub/secret.md"):
            try:
                assert SECRET not in str(index.get(path)["text"])
            except PathError:
                pass
    assert index.reader().execute("SELECT count(*) FROM files WHERE path = 'memory/steady.md'") == [(1,)]
    assert reasons, "the swaps were seen"
    print(f"{SYNCS} syncs in {time.perf_counter() - started:.2f}s, {swapping.swaps} swaps, reasons {sorted(reasons)}")
