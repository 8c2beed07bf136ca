"""A number read from an environment variable, with its range checked and an error that names the variable.

One reader for every numeric setting read outside Django's settings (the agent's quiet windows, the build memory
budget, the host's memory ledger) and inside them (platform/kiln/settings.py turns the ValueError into
ImproperlyConfigured). It lives in devices/ because the agent imports neither Django, kiln nor workers.
"""
from __future__ import annotations

import math
import os


def env_number(name: str, default, *, whole: bool = False, low: float | None = None, high: float | None = None,
               unit: str = "", unset: tuple[str, ...] = ("",)):
    """The value of environment variable `name` as an int (`whole`) or a float within [low, high]; `default` when it
    is unset or its text is one of `unset`. Anything else raises a ValueError that says what to set."""
    raw = os.environ.get(name, "").strip()
    if raw in unset:
        return default
    expected = _expected(whole, low, high, unit)
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ValueError(f"{name} must be {expected}, got {raw!r}") from None
    if math.isnan(value) or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {expected}, got {value:g}")
    return value


def _expected(whole: bool, low: float | None, high: float | None, unit: str) -> str:
    """'a whole number of megabytes, at least 256', 'a number from 0 to 0.9': what the variable takes, in words."""
    noun = ("a whole number" if whole else "a number") + (f" of {unit}" if unit else "")
    if low is not None and high is not None:
        return f"{noun} from {low:g} to {high:g}"
    if low is not None:
        return f"{noun}, at least {low:g}"
    if high is not None:
        return f"{noun}, at most {high:g}"
    return noun
