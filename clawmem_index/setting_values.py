"""A setting's value as its type wants it, from a TOML settings file or an environment variable's text.

Environment variables are text, TOML values are typed: both go through `coerce`, so "yes", "1" and `true`
are one boolean, a list and a `:`-separated string one tuple, and a wrong value is a ConfigError naming its key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clawmem_index.errors import ConfigError

__all__ = ["coerce"]


def coerce(key: str, value: Any, ftype: Any) -> Any:  # noqa: C901
    """`value` (from a settings file or an environment variable) as a setting of type `ftype` (the dataclass
    field's type, a string under `from __future__ import annotations`); ConfigError naming `key` if it is not one."""
    t = str(ftype)
    try:
        if t == "bool":
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return lowered in ("1", "true", "yes", "on")
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if t == "int":
            if isinstance(value, bool) or isinstance(value, float):
                raise ValueError(value)
            return int(value)
        if t == "float":
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if t == "str":
            if not isinstance(value, str):
                raise ValueError(value)
            folded = key.endswith(("provider", "fallback", "mode", "fusion", "log_level"))
            return value.strip().lower() if folded else value
        if "Mapping" in t:
            if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
                raise ValueError(value)
            return dict(value)
        if "tuple" in t:
            if key == "sources" and isinstance(value, str):
                parts = value.replace(os.pathsep, ",").split(",")
                return tuple(part.strip().lower() for part in parts if part.strip())
            items = value.split(os.pathsep) if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
                raise ValueError(value)
            return tuple(items)
        if "Path" in t:
            if not isinstance(value, str | os.PathLike):
                raise ValueError(value)
            return Path(value)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid setting {key!r}: {value!r} is not a valid {t.replace(' | None', '')}") from None
    raise ConfigError(f"invalid setting {key!r}: unsupported type")  # pragma: no cover
