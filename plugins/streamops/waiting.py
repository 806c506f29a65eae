"""Polling with a deadline: the only way this project waits for anything."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_exponential

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The condition did not hold before the deadline."""


def poll_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    max_interval: float = 2.0,
) -> T:
    """Call `probe` until it returns something truthy, and return that; raise after `timeout` s.

    Exceptions from `probe` propagate at once: a probe that can fail transiently catches its
    own errors and returns a falsy value.
    """
    retrying = Retrying(
        stop=stop_after_delay(timeout),
        wait=wait_exponential(multiplier=interval, min=interval, max=max_interval),
        retry=retry_if_result(lambda result: not result),
    )
    try:
        return cast(T, retrying(probe))  # retried until truthy, so never None
    except RetryError:
        raise DeadlineExceeded(f"gave up after {timeout:g}s waiting for {what}") from None
