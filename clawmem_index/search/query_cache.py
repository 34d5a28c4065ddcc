"""Answers to repeated searches, reused while the index they came from is unchanged.

An agent asks the same question again and again (every turn, every retry); embedding the query and
fusing both sides each time is wasted work when nothing changed. An answer is keyed by the request,
the search settings, and the reading connection with its `PRAGMA data_version`, which SQLite
changes whenever any other connection (the daemon's writer, another process) commits: so any
change to the index, from anywhere, misses. Entries are also dropped after `ttl` seconds (the
answer may depend on the date) and the least recently used go first once `entries` are held.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["QueryCache"]

V = TypeVar("V")


class QueryCache(Generic[V]):
    def __init__(self, entries: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries = entries
        self.ttl = ttl
        self._clock = clock
        self._held: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._held.get(key)
            if found is None or self._clock() - found[0] > self.ttl:
                if found is not None:
                    del self._held[key]
                self.misses += 1
                return None
            self._held.move_to_end(key)
            self.hits += 1
            return found[1]

    def put(self, key: Hashable, value: V) -> None:
        if self.entries <= 0:
            return
        with self._lock:
            self._held[key] = (self._clock(), value)
            self._held.move_to_end(key)
            while len(self._held) > self.entries:
                self._held.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()

    def __len__(self) -> int:
        return len(self._held)
