from __future__ import annotations

import email.utils
import time
from collections.abc import Callable

import pytest

from clawmem_index.embeddings.retry import (
    Failure,
    Kind,
    RetryPolicy,
    backoff_delay,
    call_with_retries,
    failure_from_status,
    parse_retry_after,
    redact,
)
from clawmem_index.errors import AuthError, ProviderError, ProviderTimeout, RateLimited

NOW = 1_700_000_000.0
SECRET = "sk-live-0123456789abcdef"


class Boom(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.detail)
        self.failure = failure


def classify(exc: Exception) -> Failure | None:
    return exc.failure if isinstance(exc, Boom) else None


def script(*outcomes: Failure | str) -> tuple[Callable[[], str], list[int]]:
    """An attempt function that fails with the given failures in turn, or returns a string."""
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        outcome = outcomes[min(len(calls), len(outcomes)) - 1]
        if isinstance(outcome, Failure):
            raise Boom(outcome)
        return outcome

    return attempt, calls


def policy(sleeps: list[float], *, max_retries: int = 3, rng: float = 0.5, max_delay: float = 60.0) -> RetryPolicy:
    return RetryPolicy(max_retries=max_retries, base_delay=0.5, max_delay=max_delay, sleep=sleeps.append,
                       rng=lambda: rng, clock=lambda: NOW)


def test_parse_retry_after_seconds_and_dates() -> None:
    assert parse_retry_after("3", clock=lambda: NOW) == 3.0
    assert parse_retry_after(" 1.5 ", clock=lambda: NOW) == 1.5
    assert parse_retry_after("-4", clock=lambda: NOW) == 0.0
    date = email.utils.formatdate(NOW + 7, usegmt=True)
    assert parse_retry_after(date, clock=lambda: NOW) == pytest.approx(7.0)
    past = email.utils.formatdate(NOW - 100, usegmt=True)
    assert parse_retry_after(past, clock=lambda: NOW) == 0.0
    for junk in (None, "", "soon", "nan", "inf"):
        assert parse_retry_after(junk, clock=lambda: NOW) is None


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    top = RetryPolicy(base_delay=0.5, max_delay=10.0, rng=lambda: 1.0)
    assert [backoff_delay(n, top) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff_delay(500, top) == 10.0
    assert backoff_delay(3, RetryPolicy(base_delay=0.5, rng=lambda: 0.0)) == 0.0
    assert backoff_delay(2, RetryPolicy(base_delay=0.5, rng=lambda: 0.25)) == 0.5


def test_status_classification() -> None:
    assert failure_from_status(429, {"Retry-After": "2"}).retry_after == 2.0
    assert failure_from_status(429, {"retry-after": "2"}).kind is Kind.RATE_LIMITED
    assert failure_from_status(503, {"retry-after": "4"}) == Failure(Kind.SERVER, "", 503, 4.0)
    assert failure_from_status(500).kind is Kind.SERVER
    assert failure_from_status(408).kind is Kind.TIMEOUT
    assert failure_from_status(401).kind is Kind.AUTH
    assert failure_from_status(403).kind is Kind.AUTH
    assert failure_from_status(400).kind is Kind.REJECTED
    assert failure_from_status(404).kind is Kind.REJECTED
    assert not Kind.AUTH.retryable and not Kind.BAD_RESPONSE.retryable and not Kind.REJECTED.retryable
    assert Kind.RATE_LIMITED.retryable and Kind.SERVER.retryable and Kind.TIMEOUT.retryable


def test_retries_server_errors_then_succeeds() -> None:
    sleeps: list[float] = []
    attempt, calls = script(Failure(Kind.SERVER, status=500), Failure(Kind.CONNECTION), "ok")
    assert call_with_retries(attempt, classify, policy(sleeps), what="test") == "ok"
    assert len(calls) == 3
    assert sleeps == [0.25, 0.5]


def test_honours_retry_after() -> None:
    sleeps: list[float] = []
    attempt, _ = script(Failure(Kind.RATE_LIMITED, status=429, retry_after=7.0), "ok")
    assert call_with_retries(attempt, classify, policy(sleeps), what="test") == "ok"
    assert sleeps == [7.0]


def test_retry_after_below_the_backoff_does_not_shorten_it() -> None:
    sleeps: list[float] = []
    attempt, _ = script(Failure(Kind.SERVER), Failure(Kind.SERVER), Failure(Kind.SERVER, retry_after=0.0), "ok")
    call_with_retries(attempt, classify, policy(sleeps, rng=1.0), what="test")
    assert sleeps == [0.5, 1.0, 2.0]


def test_retry_after_over_the_cap_gives_up_at_once() -> None:
    sleeps: list[float] = []
    attempt, calls = script(Failure(Kind.RATE_LIMITED, status=429, retry_after=3600.0), "ok")
    with pytest.raises(RateLimited, match="3600 s"):
        call_with_retries(attempt, classify, policy(sleeps, max_delay=30.0), what="test")
    assert sleeps == [] and len(calls) == 1


def test_no_wait_exceeds_the_cap() -> None:
    sleeps: list[float] = []
    attempt, _ = script(Failure(Kind.TIMEOUT))
    with pytest.raises(ProviderTimeout):
        call_with_retries(attempt, classify, policy(sleeps, max_retries=12, rng=1.0, max_delay=3.0), what="test")
    assert len(sleeps) == 12 and max(sleeps) == 3.0


@pytest.mark.parametrize(("kind", "error"), [
    (Kind.RATE_LIMITED, RateLimited),
    (Kind.SERVER, ProviderTimeout),
    (Kind.TIMEOUT, ProviderTimeout),
    (Kind.CONNECTION, ProviderTimeout),
])
def test_gives_up_after_the_bound(kind: Kind, error: type[ProviderError]) -> None:
    sleeps: list[float] = []
    attempt, calls = script(Failure(kind, "still failing", status=503))
    with pytest.raises(error, match=r"demo call failed after 4 attempts: HTTP 503 .*still failing") as info:
        call_with_retries(attempt, classify, policy(sleeps, max_retries=3), what="demo call")
    assert len(calls) == 4 and len(sleeps) == 3
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_zero_retries_means_one_attempt() -> None:
    sleeps: list[float] = []
    attempt, calls = script(Failure(Kind.SERVER, status=502))
    with pytest.raises(ProviderTimeout, match="after 1 attempt:"):
        call_with_retries(attempt, classify, policy(sleeps, max_retries=0), what="test")
    assert len(calls) == 1 and sleeps == []


@pytest.mark.parametrize(("kind", "error"), [
    (Kind.AUTH, AuthError), (Kind.REJECTED, ProviderError), (Kind.BAD_RESPONSE, ProviderError),
])
def test_permanent_failures_are_not_retried(kind: Kind, error: type[ProviderError]) -> None:
    sleeps: list[float] = []
    attempt, calls = script(Failure(kind, "nope"), "ok")
    with pytest.raises(error) as info:
        call_with_retries(attempt, classify, policy(sleeps), what="test")
    assert type(info.value) is error
    assert len(calls) == 1 and sleeps == []


def test_unknown_exceptions_propagate_untouched() -> None:
    def attempt() -> str:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        call_with_retries(attempt, classify, policy([]), what="test")


def test_the_key_never_appears_in_the_message() -> None:
    attempt, _ = script(Failure(Kind.AUTH, f"Incorrect API key provided: {SECRET}", status=401))
    with pytest.raises(AuthError) as info:
        call_with_retries(attempt, classify, policy([]), what="test", secrets=[SECRET])
    assert SECRET not in str(info.value) and "***" in str(info.value)


def test_redact() -> None:
    assert redact("a sk-1234 b sk-12345", ["sk-1234", "sk-12345"]) == "a *** b ***"
    assert redact("abc", ["", "b"]) == "abc"


def test_default_sleep_really_waits_briefly() -> None:
    attempt, calls = script(Failure(Kind.SERVER), "ok")
    quick = RetryPolicy(max_retries=1, base_delay=0.01, max_delay=0.01)
    started = time.monotonic()
    assert call_with_retries(attempt, classify, quick, what="test") == "ok"
    assert len(calls) == 2 and time.monotonic() - started < 5
