"""How times and durations appear in answers: ISO-8601 UTC instants, seconds with sensible precision."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["iso_time", "seconds"]


def iso_time(epoch: object) -> str | None:
    """An epoch time as ISO-8601 UTC to the second, None when unknown."""
    if not isinstance(epoch, int | float) or isinstance(epoch, bool):
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def seconds(duration: object) -> float | None:
    """A duration in seconds to the millisecond, None when unknown."""
    if not isinstance(duration, int | float) or isinstance(duration, bool):
        return None
    return round(float(duration), 3)
