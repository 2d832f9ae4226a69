"""One frozen configuration built from command-line options and ini values.

Every parser here rejects a bad value with a :class:`ConfigError` whose message names the
option, the bad value and where it came from; the plugin turns that into pytest's usage
error (exit status 4, one line, no traceback).  No torch, no pytest.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import TypeGuard

BACKENDS = ("auto", "nccl", "gloo")
#: The baseline folder under the rootdir, where ``--distperf-baselines`` does not say.
DEFAULT_BASELINES_DIRNAME = "perf_baselines"
DEFAULT_TIMEOUT_S = 300.0
#: Shorter hang timeouts are refused: they would declare every call hung.
MIN_TIMEOUT_S = 1.0

#: Threshold defaults (docs/contract.md); overridable per environment (baselines) and per test.
DEFAULT_THRESHOLDS: dict[str, float] = {
    "max_comm_overhead": 0.30,
    "max_imbalance": 0.10,
    "min_scaling_efficiency": 0.80,
}
#: Default relative tolerance of the baseline comparison (10%).
DEFAULT_TOLERANCE = 0.10
#: Default tolerance of exact metrics (collective calls and bytes per step), absolute: 0,
#: any change counts.
DEFAULT_EXACT_TOLERANCE = 0.0

#: Keywords the ``distperf`` marker accepts.
MARKER_KEYWORDS = ("world_size", *DEFAULT_THRESHOLDS, "tolerance", "exact_tolerance")


class ConfigError(ValueError):
    """A bad option, ini value or marker argument; the message says which and why."""


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a whole number: an int, and not a bool (which is one to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_int(value: object, what: str, least: int) -> int:
    """``value`` when it is an int >= ``least``; else ValueError: ``<what> must be an int >=
    <least>, got <value>``."""
    if not is_int(value) or value < least:
        raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class DistperfConfig:
    enabled: bool = False
    gpus: int | None = None  # None: visible CUDA devices, or 2 where there are none
    backend: str = "auto"
    save: bool = False
    baselines_dir: Path | None = None  # None: <rootdir>/perf_baselines
    timeout_s: float = DEFAULT_TIMEOUT_S
    json_path: Path | None = None
    trace_dir: Path | None = None
    strict: bool = False
    tolerance: float = DEFAULT_TOLERANCE  # of the baseline comparison; marker/baselines override
    exact_tolerance: float = DEFAULT_EXACT_TOLERANCE  # of exact metrics, absolute


def parse_gpus(value: object, source: str) -> int:
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(
            f"--gpus: expected a whole number of ranks >= 1, got {text!r} (from {source})"
        ) from None
    if n < 1:
        raise ConfigError(f"--gpus: the world size must be at least 1, got {n} (from {source})")
    return n


def parse_backend(value: object, source: str) -> str:
    text = str(value).strip().lower()
    if text not in BACKENDS:
        raise ConfigError(
            f"--distperf-backend: expected one of {', '.join(BACKENDS)}, got {value!r} "
            f"(from {source})"
        )
    return text


def parse_timeout(value: object, source: str) -> float:
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(
            f"--distperf-timeout: expected a number of seconds, got {text!r} (from {source})"
        ) from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigError(
            f"--distperf-timeout: expected a positive, finite number of seconds, got {text!r} "
            f"(from {source})"
        )
    if seconds < MIN_TIMEOUT_S:
        raise ConfigError(
            f"--distperf-timeout: {text} s is too short for any call on the ranks (a barrier "
            f"alone can take that long); use at least {MIN_TIMEOUT_S:g} (from {source})")
    return seconds


def parse_bool(value: object, option: str, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{option}: expected true or false, got {value!r} (from {source})")


def parse_tolerance(value: object, name: str, source: str) -> float:
    """A relative tolerance: a fraction from 0 to 1 (0.10 is 10%); 10 would switch the gate
    off (a change of 1000%), so it is refused with the likely meaning."""
    number = parse_fraction(value, name, source)
    if number > 1:
        raise ConfigError(
            f"{name}: the tolerance is a fraction (0.10 means 10%), got {value!r}; for "
            f"{number:g}% write {number / 100:g} (from {source})")
    return number


def parse_fraction(value: object, name: str, source: str) -> float:
    """A threshold or tolerance: a finite number >= 0."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r} (from {source})")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {value!r} (from {source})") from None
    if not (number >= 0 and math.isfinite(number)):
        raise ConfigError(f"{name}: expected a finite number >= 0, got {value!r} (from {source})")
    return number


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*((?:[KMGT]i?)?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(value: object) -> int:
    """A byte count from an int or a string such as ``"64KiB"``, ``"16MiB"``, ``"1GiB"``.

    Binary units throughout (``K``, ``KB`` and ``KiB`` all mean 1024).  Raises ``ValueError``
    with the bad value and the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"size must be a byte count or a string like '64KiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must be >= 0 bytes, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match:
            number = float(match.group(1))
            unit = (match.group(2) or "").upper().replace("I", "").rstrip("B") or ""
            if unit in _UNITS:
                size = number * _UNITS[unit]
                if size == int(size):
                    return int(size)
    raise ValueError(
        f"bad size {value!r}: use a byte count (int) or a string like '512', '64KiB', "
        f"'16MiB', '1GiB'"
    )


def format_size(nbytes: int) -> str:
    """The inverse of :func:`parse_size` for whole binary units: 16777216 -> ``"16MiB"``."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"


def format_bytes(nbytes: float) -> str:
    """A byte count for people, to three significant digits: ``1.5 MiB``, ``512 B``."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{nbytes:.0f} B"


def validate_marker_kwargs(kwargs: dict[str, object], where: str) -> dict[str, float | int]:
    """Check the ``distperf`` marker's keywords; unknown ones are an error naming them."""
    unknown = sorted(set(kwargs) - set(MARKER_KEYWORDS))
    if unknown:
        raise ConfigError(
            f"@pytest.mark.distperf on {where}: unknown keyword {unknown[0]!r}; "
            f"valid keywords: {', '.join(MARKER_KEYWORDS)}"
        )
    out: dict[str, float | int] = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        if key == "world_size":
            if not is_int(value) or value < 1:
                raise ConfigError(
                    f"@pytest.mark.distperf on {where}: world_size must be an int >= 1, "
                    f"got {value!r}"
                )
            out[key] = value
        elif key == "tolerance":
            out[key] = parse_tolerance(value, key, f"@pytest.mark.distperf on {where}")
        else:
            out[key] = parse_fraction(value, key, f"@pytest.mark.distperf on {where}")
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where a pool's ranks go: how many, on which backend, from which CUDA device on."""

    world_size: int
    backend: str  # "nccl" or "gloo"
    device_offset: int  # rank r uses cuda:(device_offset + r) on NCCL; 0 on gloo


def place_ranks(requested_backend: str, gpus: int | None, visible_gpus: int,
                nccl_available: bool, worker_index: int = 0, worker_count: int = 1) -> Placement:
    """Choose world size, backend and devices for one pool (one per pytest-xdist worker).

    World size: ``--gpus``, else the visible GPUs divided between xdist workers, else 2.
    ``auto`` takes NCCL when this worker's slice of devices (``I*N .. I*N+N-1`` for worker
    ``gwI``) exists; an explicit ``nccl`` without that slice is a ConfigError that says how many
    devices are needed and how many are visible.
    """
    if gpus is not None:
        world = gpus
    elif visible_gpus:
        world = max(1, visible_gpus // max(1, worker_count))
    else:
        world = 2
    offset = worker_index * world
    fits = nccl_available and visible_gpus >= offset + world
    backend = requested_backend
    if backend == "auto":
        backend = "nccl" if fits else "gloo"
    if backend == "nccl" and not fits:
        if not nccl_available:
            raise ConfigError(
                "--distperf-backend nccl: this PyTorch has no CUDA/NCCL support or no GPU is "
                "usable; use --distperf-backend gloo")
        where = ""
        if worker_count > 1:
            where = (f" for xdist worker gw{worker_index} of {worker_count}, which takes "
                     f"devices {offset}..{offset + world - 1}")
        raise ConfigError(
            f"--distperf-backend nccl needs {offset + world} GPUs (one per rank{where}) but "
            f"{visible_gpus} are visible; lower --gpus, use fewer xdist workers, or use "
            f"--distperf-backend gloo")
    return Placement(world, backend, offset if backend == "nccl" else 0)
