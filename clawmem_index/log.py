"""structlog set-up: JSON lines when stderr is not a terminal (journald, files), readable text when it is."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["configure", "get_logger"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", *, json_lines: bool | None = None, stream: Any = None) -> None:
    import structlog

    out = stream or sys.stderr
    as_json = (not out.isatty()) if json_lines is None else json_lines
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "clawmem") -> Any:
    import structlog

    return structlog.get_logger(name)
