"""clawmem: a SQLite search index kept in step with an agent's Markdown memory.

`from clawmem import Client` is the Python API (clawmem.api). It is loaded on first use, so
`import clawmem` (and every `clawmem` command) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clawmem.api import Client

__all__ = ["DISTRIBUTION", "Client", "__version__"]

__version__ = "0.1.0"
DISTRIBUTION = "clawmem-index"
"""The name to `pip install`: `clawmem` on the package index is another project (it also installs a
`clawmem` import package, so the two cannot be installed side by side)."""


def __getattr__(name: str) -> Any:
    if name == "Client":
        from clawmem.api import Client

        return Client
    raise AttributeError(f"module 'clawmem' has no attribute {name!r}")
