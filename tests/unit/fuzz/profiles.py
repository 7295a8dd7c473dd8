"""The fuzz suite's hypothesis profiles (see conftest.py)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}

settings.register_profile("ci", max_examples=150, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("nightly", max_examples=5000, **_COMMON)  # type: ignore[arg-type]

#: The profile of this run: ``HYPOTHESIS_PROFILE`` when it names a fuzz profile, else ``ci``.
NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if NAME not in ("ci", "nightly"):
    NAME = "ci"
FUZZ = settings.get_profile(NAME)


def scaled(factor: float) -> settings:
    """The run's profile with ``factor`` times its examples (for slow, end-to-end properties)."""
    return settings(FUZZ, max_examples=max(10, int(FUZZ.max_examples * factor)))
