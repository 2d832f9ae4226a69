"""What this rank is doing now: the phase a timed-out call's report shows (stdlib only).

The controller gives each spawned rank a small shared buffer
(:class:`~pytest_distperf.pool.launcher.RankPool`); :func:`attach` hands it to this module
when the rank starts, and the rank's code writes into it with :func:`set_phase`.
"""

from __future__ import annotations

from typing import Any

#: Shared buffer of this rank's current phase (the flight recorder the controller reads).
_phase_buffer: Any = None


def attach(buffer: Any) -> None:
    """Write the phases of this process into ``buffer`` (a ``ctypes`` char array)."""
    global _phase_buffer
    _phase_buffer = buffer


def set_phase(text: str) -> None:
    """Say what this rank is doing now; shown when a call times out.  Cheap; safe anywhere
    (outside a spawned rank it does nothing)."""
    if _phase_buffer is not None:
        data = text.encode("utf-8", "replace")[: len(_phase_buffer) - 1]
        _phase_buffer.value = data
