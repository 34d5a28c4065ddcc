"""Retries for remote embedding calls: exponential backoff with full jitter, `Retry-After`, a bound.

The SDKs' own retries are switched off so this is the only retry loop: one policy for every
provider, with waits a test can record instead of sleep through. Each provider maps its SDK's
exceptions to a `Failure`; this module decides whether to wait and try again or to give up with
one of clawmem's errors. Messages are scrubbed of the API key, and the SDK exception is not
chained (`from None`): SDK errors carry request objects whose headers hold the key, and a logged
traceback would print them.
"""

from __future__ import annotations

import enum
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from clawmem_index.errors import AuthError, ProviderError, ProviderTimeout, RateLimited

__all__ = [
    "Failure",
    "Kind",
    "Pause",
    "RetryPolicy",
    "backoff_delay",
    "call_with_retries",
    "failure_from_status",
    "parse_retry_after",
    "redact",
]

T = TypeVar("T")

_DETAIL_CHARS = 300


class Kind(enum.Enum):
    """What went wrong with one attempt; the first four are worth another try."""

    RATE_LIMITED = "rate limited"
    SERVER = "server error"
    TIMEOUT = "timed out"
    CONNECTION = "connection failed"
    AUTH = "credentials refused"
    BAD_RESPONSE = "malformed response"
    REJECTED = "request rejected"

    @property
    def retryable(self) -> bool:
        return self in (Kind.RATE_LIMITED, Kind.SERVER, Kind.TIMEOUT, Kind.CONNECTION)


@dataclass(frozen=True)
class Failure:
    kind: Kind
    detail: str = ""
    status: int | None = None
    retry_after: float | None = None

    def describe(self) -> str:
        status = f"HTTP {self.status} " if self.status is not None else ""
        detail = " ".join(self.detail.split())[:_DETAIL_CHARS]
        return f"{status}{self.kind.value}" + (f": {detail}" if detail else "")


@dataclass(frozen=True)
class RetryPolicy:
    """`max_retries` retries after the first attempt; no single wait is longer than `max_delay`."""

    max_retries: int = 5
    base_delay: float = 0.5
    max_delay: float = 60.0
    sleep: Callable[[float], None] = time.sleep
    rng: Callable[[], float] = random.random
    clock: Callable[[], float] = time.time


def failure_from_status(status: int, headers: Mapping[str, str] | None = None, detail: str = "",
                        *, clock: Callable[[], float] = time.time) -> Failure:
    """Classify an HTTP error status; `Retry-After` is kept for 429 and 5xx answers."""
    retry_after = parse_retry_after(_header(headers, "retry-after"), clock=clock)
    if status == 429:
        return Failure(Kind.RATE_LIMITED, detail, status, retry_after)
    if status in (401, 403):
        return Failure(Kind.AUTH, detail, status)
    if status == 408:
        return Failure(Kind.TIMEOUT, detail, status, retry_after)
    if status >= 500:
        return Failure(Kind.SERVER, detail, status, retry_after)
    return Failure(Kind.REJECTED, detail, status)


def parse_retry_after(value: str | None, *, clock: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a `Retry-After` value (delta-seconds or an HTTP date); None if absent or unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        import email.utils  # 3 ms, and an HTTP date here is rare: not on every command's start-up

        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - clock()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def backoff_delay(retry: int, policy: RetryPolicy) -> float:
    """Full jitter: uniform in [0, min(max_delay, base_delay * 2**retry)] for the `retry`-th retry (0-based)."""
    ceiling = min(policy.max_delay, policy.base_delay * (2.0 ** min(retry, 60)))
    return ceiling * policy.rng()


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret (of 4+ characters, so short strings cannot mangle a message) with ***."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class Pause:
    """A pause shared by the requests one provider has in flight.

    When the provider answers 429 with `Retry-After`, the request told so waits (its own backoff)
    and every other request waits out the same time before its next attempt: concurrent requests
    must not keep knocking. The waits use the retry policy's `sleep`.
    """

    def __init__(self, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._until = 0.0
        self._holder: int | None = None
        self._lock = threading.Lock()
        self._sleep = sleep
        self._clock = clock

    def hold(self, seconds: float) -> None:
        with self._lock:
            until = self._clock() + seconds
            if until > self._until:
                self._until, self._holder = until, threading.get_ident()

    def wait(self) -> None:
        """Sleep until the pause ends, unless this thread set it (it sleeps its own backoff)."""
        with self._lock:
            left = self._until - self._clock()
            mine = self._holder == threading.get_ident()
        if left > 0 and not mine:
            self._sleep(left)


def call_with_retries(
    attempt: Callable[[], T],
    classify: Callable[[Exception], Failure | None],
    policy: RetryPolicy,
    *,
    what: str,
    secrets: Iterable[str] = (),
    pause: Pause | None = None,
) -> T:
    """Run `attempt` until it succeeds, retrying retryable failures within `policy`.

    `classify` returns None for an exception it does not recognise (a bug, not a provider
    failure): that exception propagates untouched. `what` names the call in error messages.
    A `pause` shared with other requests to the same provider is waited out before each attempt
    and extended by every `Retry-After`.
    """
    hidden = tuple(secrets)
    retries = 0
    while True:
        if pause is not None:
            pause.wait()
        try:
            return attempt()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
        if not failure.kind.retryable:
            raise _error_for(failure, f"{what} failed: {failure.describe()}", hidden) from None
        if retries >= policy.max_retries:
            tries = "attempt" if retries == 0 else "attempts"
            raise _error_for(failure, f"{what} failed after {retries + 1} {tries}: {failure.describe()}",
                             hidden) from None
        delay = backoff_delay(retries, policy)
        if failure.retry_after is not None:
            if failure.retry_after > policy.max_delay:
                message = (f"{what} failed: {failure.describe()}; the provider asked to wait "
                           f"{failure.retry_after:.0f} s, more than the {policy.max_delay:.0f} s limit on one wait")
                raise _error_for(failure, message, hidden) from None
            delay = max(delay, failure.retry_after)
            if pause is not None:
                pause.hold(failure.retry_after)
        policy.sleep(delay)
        retries += 1


def _error_for(failure: Failure, message: str, secrets: tuple[str, ...]) -> ProviderError:
    message = redact(message, secrets)
    if failure.kind is Kind.RATE_LIMITED:
        return RateLimited(message)
    if failure.kind in (Kind.SERVER, Kind.TIMEOUT, Kind.CONNECTION):
        return ProviderTimeout(message)
    if failure.kind is Kind.AUTH:
        return AuthError(message)
    return ProviderError(message)


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value
