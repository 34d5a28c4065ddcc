"""clawmem (distribution clawmem-index): a SQLite search index kept in step with an agent's Markdown memory.

`from clawmem_index import Client` is the Python API (clawmem_index.api). It is loaded on first use, so
`import clawmem_index` (and every `clawmem` command) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clawmem_index.api import Client

__all__ = ["DISTRIBUTION", "Client", "__version__"]

__version__ = "0.1.0"
DISTRIBUTION = "clawmem-index"
"""The name to `pip install`, and so the import name `clawmem_index`: `clawmem` on the package index is
another project, which installs a `clawmem` import package of its own."""


def __getattr__(name: str) -> Any:
    if name == "Client":
        from clawmem_index.api import Client

        return Client
    raise AttributeError(f"module 'clawmem_index' has no attribute {name!r}")
