"""The `clawmem` command: a thin layer that parses flags, calls the engine and formats answers (a front door: it may
use every layer below it).

One module per group of commands (`writing`, `reading`, `serving`, `openclaw`), on the group and helpers of `base`.
Heavy modules (the engine, structlog, provider SDKs) are imported inside the commands so that
`clawmem search` starts fast.
"""

from __future__ import annotations

from clawmem_index.cli import openclaw, reading, serving, writing  # noqa: F401 - each registers its commands on `cli`
from clawmem_index.cli.base import cli, fail
from clawmem_index.errors import ClawmemError

__all__ = ["cli", "main"]


def main() -> None:
    try:
        cli.main(prog_name="clawmem", standalone_mode=True)
    except ClawmemError as exc:  # pragma: no cover - commands map their own errors
        fail(exc)
