"""`clawmem init`: copy the starter workspace without ever overwriting a file."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from clawmem_index.errors import ConfigError

__all__ = ["copy_template", "template_dir"]


def template_dir() -> Path:
    package = Path(__file__).resolve().parents[1]  # the data folder sits at the package's top, a link to the repo's
    for candidate in (package / "workspace_template", package.parent / "workspace_template"):
        if (candidate / "MEMORY.md").is_file():
            return candidate
    raise ConfigError("the starter workspace is missing from this installation of clawmem")


def copy_template(target: Path, *, dry_run: bool = False) -> Iterator[tuple[str, str]]:
    """Yield (relative path, 'create' | 'keep') for every template file; existing files are kept as they are."""
    source = template_dir()
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} exists and is not a directory")
    for src in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = src.relative_to(source)
        dest = target / rel
        if dest.exists() or dest.is_symlink():
            yield str(rel), "keep"
            continue
        if not dry_run:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with src.open("rb") as fsrc, open(dest, "xb") as fdst:
                shutil.copyfileobj(fsrc, fdst)
        yield str(rel), "create"
