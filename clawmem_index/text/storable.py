"""Text as the index can store it: valid Unicode, whatever a file, a transcript or a query carried.

Python text may hold lone surrogates (a JSON `\\udc00` escape, a model's split emoji pair), which no
UTF-8 encoder accepts: one such character made SQLite refuse the chunk, and the sync with it. Every
lone surrogate is replaced by U+FFFD (the replacement character, as invalid UTF-8 in a memory
file already is); a valid pair is kept as the one character it stands for.
"""

from __future__ import annotations

import re

__all__ = ["storable"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (unchanged, and not copied, when it has none)."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
