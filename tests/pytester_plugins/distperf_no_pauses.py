"""Loaded into every pytester run of the plugin's tests (conftest.py): the verdict's pauses
between measurements go to zero.  They spread a real gate's measurements over a few seconds
of a host's speed; a test proves a behaviour with effects no pause changes, and
tests/test_baseline.py checks the pauses themselves."""

from __future__ import annotations

from judgement_patch import JudgementPatch


def _zero(value: float | tuple[float, ...]) -> float | tuple[float, ...]:
    return (0.0,) * len(value) if isinstance(value, tuple) else 0.0


_PATCH = JudgementPatch({name: _zero for name in (
    "_CONFIRM_PAUSES_S", "_CONTROL_PAUSE_S", "_SAVE_PAUSE_S", "_NOISY_BACKOFF_S")})
pytest_configure = _PATCH.pytest_configure
pytest_unconfigure = _PATCH.pytest_unconfigure
