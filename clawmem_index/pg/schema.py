"""`grant_workspace` and `migrate` at their documented path; the schema is `clawmem_index.index.pg.schema`."""

from __future__ import annotations

from clawmem_index.index.pg.schema import grant_workspace, migrate

__all__ = ["grant_workspace", "migrate"]
