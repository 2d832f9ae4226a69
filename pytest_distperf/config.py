"""One frozen configuration built from command-line options and ini values.

Every parser here rejects a bad value with a :class:`ConfigError` whose message names the
option, the bad value and where it came from; the plugin turns that into pytest's usage
error (exit status 4, one line, no traceback).  No torch, no pytest.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeGuard

#: ``gloo-cuda``: gloo ranks whose tensors are on the GPUs, several to a GPU where they must.
BACKENDS = ("auto", "nccl", "gloo", "gloo-cuda")
#: The NCCL that first lets several ranks share a GPU (experimental, behind
#: ``NCCL_MULTI_RANK_GPU_ENABLE=1``), and how many it lets share one.
NCCL_SHARED_GPU_VERSION = (2, 30)
NCCL_MAX_RANKS_PER_GPU = 2
#: The variable that asks NCCL for several ranks per GPU.
NCCL_SHARED_GPU_VARIABLE = "NCCL_MULTI_RANK_GPU_ENABLE"
#: The baseline folder under the rootdir, where ``--distperf-baselines`` does not say.
DEFAULT_BASELINES_DIRNAME = "perf_baselines"
DEFAULT_TIMEOUT_S = 300.0
#: Shorter hang timeouts are refused: they would declare every call hung.
MIN_TIMEOUT_S = 1.0
#: Longer ones are refused: a week is beyond any CI job, and far longer waits overflow the
#: operating system's (a timeout of 1e300 s ended in an OverflowError).
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: The most ranks ``--gpus`` may ask for: more than any one machine has GPUs or cores for
#: (``--gpus 99999999`` would have started that many processes).
MAX_WORLD_SIZE = 1024
#: The largest byte count a size may be (a tensor's size in bytes is a 64-bit integer).
MAX_SIZE_BYTES = 2**63 - 1

#: Threshold defaults (docs/contract.md); overridable per environment (baselines) and per test.
DEFAULT_THRESHOLDS: dict[str, float] = {
    "max_comm_overhead": 0.30,
    "max_imbalance": 0.10,
    "min_scaling_efficiency": 0.80,
    # ddp_step_timer.pipeline: 1 - the pipeline's bubble (docs/metrics.md)
    "min_pipeline_utilisation": 0.70,
    # ddp_step_timer(mesh=...): the share of a step its ranks are blocked in TP collectives
    "max_tp_comm_share": 0.40,
    # dist_profiler's profile.arrival_skew: off unless set (on a shared CPU runner a skew is
    # mostly scheduling; on GPUs, where a late rank is a real straggler, set it)
    "max_arrival_skew": math.inf,
}
#: Default relative tolerance of the baseline comparison (10%).
DEFAULT_TOLERANCE = 0.10
#: Default tolerance of exact metrics (collective calls and bytes per step), absolute: 0,
#: any change counts.
DEFAULT_EXACT_TOLERANCE = 0.0

#: The most measurements a save takes of a metric with the host-speed control (twice the six
#: a comparison takes at most: every later comparison shares the baseline's error), and the
#: most ``--distperf-save-measurements`` may ask for.
DEFAULT_SAVE_MEASUREMENTS = 12
MAX_SAVE_MEASUREMENTS = 50

#: Keywords the ``distperf`` marker accepts.
MARKER_KEYWORDS = ("world_size", *DEFAULT_THRESHOLDS, "tolerance", "exact_tolerance")


class ConfigError(ValueError):
    """A bad option, ini value or marker argument; the message says which and why."""


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for an error message, shortened when long (a 5000-digit value, a
    pasted file): the start, and how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 20]}... ({len(text)} characters)"


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite real number (an int or a float, not a bool; an int
    beyond any float is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a whole number: an int, and not a bool (which is one to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_int(value: object, what: str, least: int) -> int:
    """``value`` when it is an int >= ``least``; else ValueError: ``<what> must be an int >=
    <least>, got <value>``."""
    if not is_int(value) or value < least:
        raise ValueError(f"{what} must be an int >= {least}, got {shown(value)}")
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
    same_ranks: bool = False  # re-measure on the pool's own ranks, never on fresh ones
    bind_ranks: bool = False  # bind each CPU rank to its own cores where they fit
    tolerance: float = DEFAULT_TOLERANCE  # of the baseline comparison; marker/baselines override
    exact_tolerance: float = DEFAULT_EXACT_TOLERANCE  # of exact metrics, absolute
    save_measurements: int = DEFAULT_SAVE_MEASUREMENTS  # a controlled metric's, per save
    env_name: str = ""  # a pinned environment name: it stands for the machine in the key


def parse_gpus(value: object, source: str) -> int:
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:  # also a number of more digits than int() reads
        raise ConfigError(
            f"--gpus: expected a whole number of ranks >= 1, got {shown(text)} (from {source})"
        ) from None
    if n < 1:
        raise ConfigError(f"--gpus: the world size must be at least 1, got {n} (from {source})")
    if n > MAX_WORLD_SIZE:
        raise ConfigError(
            f"--gpus: {shown(n)} ranks are more than one machine runs (at most "
            f"{MAX_WORLD_SIZE}); for a job across machines start pytest under torchrun "
            f"(from {source})")
    return n


def parse_save_measurements(value: object, source: str) -> int:
    """How many measurements a save pools for a metric with the host-speed control: a whole
    number from 1 to ``MAX_SAVE_MEASUREMENTS``."""
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        n = 0
    if isinstance(value, bool) or not 1 <= n <= MAX_SAVE_MEASUREMENTS:
        raise ConfigError(
            f"--distperf-save-measurements: expected a whole number from 1 to "
            f"{MAX_SAVE_MEASUREMENTS}, got {shown(value)} (from {source})")
    return n


def parse_backend(value: object, source: str) -> str:
    text = str(value).strip().lower()
    if text not in BACKENDS:
        raise ConfigError(
            f"--distperf-backend: expected one of {', '.join(BACKENDS)}, got {shown(value)} "
            f"(from {source})"
        )
    return text


#: A pinned environment name: it becomes part of a TOML key and of every verdict's line.
_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)


def parse_env_name(value: object, source: str) -> str:
    """A pinned environment name: letters, digits, ``.``, ``_`` and ``-``, 64 at most."""
    text = str(value).strip()
    if not _ENV_NAME.fullmatch(text):
        raise ConfigError(
            f"--distperf-env-name: expected a name of letters, digits, '.', '_' and '-' "
            f"(starting with a letter or a digit, at most 64), got {shown(value)}; name the "
            f"runner type, e.g. ubuntu-latest or h100x8 (from {source})")
    return text


def parse_timeout(value: object, source: str) -> float:
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(
            f"--distperf-timeout: expected a number of seconds, got {shown(text)} "
            f"(from {source})") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigError(
            f"--distperf-timeout: expected a positive, finite number of seconds, got "
            f"{shown(text)} (from {source})"
        )
    if seconds < MIN_TIMEOUT_S:
        raise ConfigError(
            f"--distperf-timeout: {shown(text)} s is too short for any call on the ranks (a "
            f"barrier alone can take that long); use at least {MIN_TIMEOUT_S:g} "
            f"(from {source})")
    if seconds > MAX_TIMEOUT_S:
        raise ConfigError(
            f"--distperf-timeout: {shown(text)} s is longer than any call should wait; use at "
            f"most {MAX_TIMEOUT_S:g} (a week) (from {source})")
    return seconds


def parse_path(value: object, option: str, source: str) -> Path:
    """A file or folder named by an option, ``~`` expanded; a relative path stays relative
    (the caller says to what).  An empty value, a NUL character, or a ``~user`` that names no
    user is a ConfigError."""
    text = str(value)
    if not text.strip() or "\0" in text:
        raise ConfigError(f"{option}: expected a path, got {shown(text)} (from {source})")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "~user" of no such user, or no home directory to expand "~" to
        raise ConfigError(
            f"{option}: cannot expand {shown(text)}: no such user, or no home directory "
            f"(from {source})") from None


def parse_bool(value: object, option: str, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{option}: expected true or false, got {shown(value)} (from {source})")


def parse_tolerance(value: object, name: str, source: str) -> float:
    """A relative tolerance: a fraction from 0 to 1 (0.10 is 10%); 10 would switch the gate
    off (a change of 1000%), so it is refused with the likely meaning."""
    number = parse_fraction(value, name, source)
    if number > 1:
        raise ConfigError(
            f"{name}: the tolerance is a fraction (0.10 means 10%), got {shown(value)}; for "
            f"{number:g}% write {number / 100:g} (from {source})")
    return number


def parse_fraction(value: object, name: str, source: str) -> float:
    """A threshold or tolerance: a finite number >= 0."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {shown(value)} (from {source})")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}: expected a number, got {shown(value)} (from {source})") from None
    except OverflowError:  # an int or a Fraction beyond any float
        number = math.inf
    if not (number >= 0 and math.isfinite(number)):
        raise ConfigError(
            f"{name}: expected a finite number >= 0, got {shown(value)} (from {source})")
    return number


_SIZE_RE = re.compile(r"^\s*(\d+)(?:\.(\d+))?\s*((?:[KMGT]i?)?B?)?\s*$",
                      re.IGNORECASE | re.ASCII)
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
#: More digits, before or after the point, than any byte count up to MAX_SIZE_BYTES needs
#: (and far fewer than int() reads: it refuses more than 4300).
_MAX_SIZE_DIGITS = 40


def parse_size(value: object) -> int:
    """A byte count from an int or a string such as ``"64KiB"``, ``"16MiB"``, ``"1GiB"``.

    Binary units throughout (``K``, ``KB`` and ``KiB`` all mean 1024); decimals that come to
    whole bytes (``"1.5KiB"``), computed exactly.  Raises ``ValueError`` with the bad value
    and the accepted forms; a count above :data:`MAX_SIZE_BYTES` is refused.
    """
    if isinstance(value, bool):
        raise ValueError(
            f"size must be a byte count or a string like '64KiB', got {shown(value)}")
    size: int | None = None
    if isinstance(value, numbers.Integral):  # int, numpy's integers
        size = int(value)
    elif isinstance(value, str):
        size = _size_from_text(value)
    if size is None:
        raise ValueError(
            f"bad size {shown(value)}: use a byte count (int) or a string like '512', "
            f"'64KiB', '16MiB', '1GiB'")
    if size < 0:
        raise ValueError(f"size must be >= 0 bytes, got {shown(value)}")
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"size {shown(value)} is larger than any tensor can be "
                         f"(at most {MAX_SIZE_BYTES} bytes)")
    return size


def _size_from_text(text: str) -> int | None:
    """The byte count ``text`` spells; None when it spells none (or not whole bytes)."""
    match = _SIZE_RE.match(text)
    if not match:
        return None
    whole, unit = match.group(1).lstrip("0"), match.group(3) or ""
    decimals = (match.group(2) or "").rstrip("0")
    if len(whole) > _MAX_SIZE_DIGITS:
        return MAX_SIZE_BYTES + 1  # refused as too large, never read digit by digit
    if len(decimals) > _MAX_SIZE_DIGITS:
        return None  # no whole number of bytes
    numerator = int(whole + decimals or "0") * _UNITS[unit.upper().replace("I", "").rstrip("B")]
    denominator = 10 ** len(decimals)
    return numerator // denominator if numerator % denominator == 0 else None


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
            f"@pytest.mark.distperf on {where}: unknown keyword {shown(unknown[0])}; "
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
                    f"got {shown(value)}"
                )
            out[key] = value
        elif key == "tolerance":
            out[key] = parse_tolerance(value, key, f"@pytest.mark.distperf on {where}")
        else:
            out[key] = parse_fraction(value, key, f"@pytest.mark.distperf on {where}")
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where a pool's ranks go: how many, on which backend, and each rank's CUDA device."""

    world_size: int
    backend: str  # "nccl" or "gloo": what torch.distributed is started with
    devices: tuple[int, ...] = ()  # rank r on cuda:devices[r]; () for CPU ranks

    @property
    def device_type(self) -> str:
        return "cuda" if self.devices else "cpu"

    @property
    def ranks_per_gpu(self) -> int:
        """The most ranks on one GPU (0 for CPU ranks)."""
        return ranks_per_gpu(self.devices)


def ranks_per_gpu(devices: tuple[int, ...]) -> int:
    """The most ranks that ``devices`` (each rank's GPU) put on one GPU; 0 without GPUs."""
    return max((devices.count(d) for d in set(devices)), default=0)


def place_ranks(requested_backend: str, gpus: int | None, visible_gpus: int,
                nccl_available: bool, worker_index: int = 0, worker_count: int = 1, *,
                nccl_version: tuple[int, ...] = (), shared_gpus: bool = False) -> Placement:
    """Choose world size, backend and devices for one pool (one per pytest-xdist worker).

    World size: ``--gpus``, else the visible GPUs divided between xdist workers (at least 2
    for ``gloo-cuda``, whose point is several ranks), else 2.  ``auto`` takes NCCL when this
    worker's slice of devices (``I*N .. I*N+N-1`` for worker ``gwI``) exists, and gloo where
    no GPU is usable.  Where GPUs are visible but too few for the slice, ``auto`` and ``nccl``
    put up to :data:`NCCL_MAX_RANKS_PER_GPU` ranks on each of the worker's GPUs when
    ``shared_gpus`` (``NCCL_MULTI_RANK_GPU_ENABLE=1``) is set and ``nccl_version`` allows
    it; else they are a ConfigError that says how many devices are needed, how many are
    visible and the ways out.  ``gloo-cuda`` puts gloo ranks round robin on the worker's
    GPUs, as many to a GPU as it takes.
    """
    if gpus is not None:
        world = gpus
    elif visible_gpus:
        world = max(1, visible_gpus // max(1, worker_count))
        world = max(world, 2) if requested_backend == "gloo-cuda" else world
    else:
        world = 2
    offset = worker_index * world
    if requested_backend == "gloo-cuda":
        if not visible_gpus:
            raise ConfigError(
                "--distperf-backend gloo-cuda: no CUDA device is visible (this torch has no "
                "CUDA support, or CUDA_VISIBLE_DEVICES hides every GPU); use "
                "--distperf-backend gloo for CPU ranks")
        return Placement(world, "gloo", _round_robin(world, visible_gpus, worker_index,
                                                     worker_count))
    if requested_backend == "gloo" or (requested_backend == "auto" and not nccl_available):
        return Placement(world, "gloo")
    if nccl_available and visible_gpus >= offset + world:
        return Placement(world, "nccl", tuple(range(offset, offset + world)))
    if not nccl_available:
        raise ConfigError(
            "--distperf-backend nccl: this PyTorch has no CUDA/NCCL support or no GPU is "
            "usable; use --distperf-backend gloo")
    if shared_gpus:
        return _shared_nccl(world, visible_gpus, worker_index, worker_count, nccl_version)
    raise ConfigError(_too_few_gpus(requested_backend, gpus, world, visible_gpus,
                                    worker_index, worker_count, nccl_version))


def _worker_gpus(visible: int, worker_index: int, worker_count: int) -> list[int]:
    """The GPUs of xdist worker ``worker_index``: its share of the visible ones, or one
    GPU, taken in turn, where the workers outnumber them."""
    share = visible // max(1, worker_count)
    if not share:
        return [worker_index % visible]
    return list(range(worker_index * share, (worker_index + 1) * share))


def _round_robin(world: int, visible: int, worker_index: int,
                 worker_count: int) -> tuple[int, ...]:
    """Rank r on the worker's GPU r mod (its GPUs): one rank per GPU where they suffice."""
    mine = _worker_gpus(visible, worker_index, worker_count)
    return tuple(mine[r % len(mine)] for r in range(world))


def version_text(version: tuple[int, ...]) -> str:
    """``2.21.5``; ``unknown`` for an empty version."""
    return ".".join(map(str, version)) or "unknown"


def _shared_nccl(world: int, visible: int, worker_index: int, worker_count: int,
                 nccl_version: tuple[int, ...]) -> Placement:
    """NCCL ranks round robin on the worker's GPUs, at most NCCL_MAX_RANKS_PER_GPU to one."""
    found = version_text(nccl_version)
    wanted = ".".join(map(str, NCCL_SHARED_GPU_VERSION))
    if tuple(nccl_version[:2]) < NCCL_SHARED_GPU_VERSION:
        raise ConfigError(
            f"{NCCL_SHARED_GPU_VARIABLE}=1: several ranks per GPU need NCCL {wanted} or later, "
            f"and this torch has NCCL {found}; use --distperf-backend gloo-cuda to run {world} "
            f"gloo ranks on the GPU (their collectives go through host memory), or a torch "
            f"built with NCCL {wanted} or later")
    devices = _round_robin(world, visible, worker_index, worker_count)
    most = ranks_per_gpu(devices)
    if most > NCCL_MAX_RANKS_PER_GPU:
        gpus = len(set(devices))
        raise ConfigError(
            f"{NCCL_SHARED_GPU_VARIABLE}=1: {world} ranks on {gpus} GPU{'s' if gpus > 1 else ''}"
            f" would put {most} on one, and NCCL {found} lets at most "
            f"{NCCL_MAX_RANKS_PER_GPU} share a GPU; use --gpus {NCCL_MAX_RANKS_PER_GPU * gpus} "
            f"or fewer, or --distperf-backend gloo-cuda to run {world} gloo ranks on the "
            f"GPU{'s' if gpus > 1 else ''}")
    return Placement(world, "nccl", devices)


def _too_few_gpus(requested_backend: str, gpus: int | None, world: int, visible: int,
                  worker_index: int, worker_count: int, nccl_version: tuple[int, ...]) -> str:
    """Why a machine with GPUs cannot give this pool one per rank, and the ways out."""
    offset = worker_index * world
    subject, needs = ("--distperf-backend nccl", "needs") if requested_backend == "nccl" else (
        (f"--gpus {gpus}", "needs") if gpus is not None
        else (f"{worker_count} xdist workers of one rank each", "need"))
    where = ""
    if worker_count > 1:
        where = (f" for xdist worker gw{worker_index} of {worker_count}, which takes "
                 f"devices {offset}..{offset + world - 1}")
    auto = ("; with GPUs visible, --distperf-backend auto does not fall back to CPU ranks"
            if requested_backend == "auto" else "")
    share = visible // worker_count
    ranks = f"{world} rank{'s' if world > 1 else ''}"
    each = f" ({share} GPUs for each of {worker_count} workers)" if worker_count > 1 else ""
    shared = (tuple(nccl_version[:2]) >= NCCL_SHARED_GPU_VERSION
              and 0 < world <= NCCL_MAX_RANKS_PER_GPU * share)
    ways = [f"--gpus {share} to run on the GPUs{each}" if 0 < share < world else "",
            f"{NCCL_SHARED_GPU_VARIABLE}=1 to put up to {NCCL_MAX_RANKS_PER_GPU} NCCL ranks "
            f"on a GPU (experimental)" if shared else "",
            "fewer xdist workers" if worker_count > 1 else "",
            f"--distperf-backend gloo to run {ranks} on the CPU on purpose",
            f"--distperf-backend gloo-cuda to run them on the GPU{'s' if visible > 1 else ''} "
            f"with gloo"]
    return (f"{subject} {needs} {offset + world} GPUs (one per rank{where}) but {visible} "
            f"{'is' if visible == 1 else 'are'} visible{auto}; use "
            f"{', or '.join(w for w in ways if w)}")


def describe_devices(devices: tuple[int, ...], visible: int) -> str:
    """Each rank's GPU in words: ``devices 0..3 of 8 visible``, or, where ranks share GPUs,
    ``2 ranks per GPU on device 0 of 1 visible`` (``devices 0, 1``)."""
    used = sorted(set(devices))
    if len(used) == len(devices) and used == list(range(used[0], used[0] + len(used))):
        return f"devices {used[0]}..{used[-1]} of {visible} visible"
    names = f"device {used[0]}" if len(used) == 1 else f"devices {', '.join(map(str, used))}"
    return f"{ranks_per_gpu(devices)} ranks per GPU on {names} of {visible} visible"


#: What gloo's figures are on GPU tensors; said in the run header, bench's table and the
#: Markdown summary.
GLOO_ON_GPU = ("gloo copies GPU tensors through host memory: its communication figures "
               "(bench's busbw, a step's communication) are gloo's, not NVLink's or PCIe's")


def placement_notes(backend: str, devices: tuple[int, ...], nccl_version: tuple[int, ...],
                    ) -> list[str]:
    """The run header's lines about ranks on GPUs that are not one NCCL rank per GPU."""
    lines = []
    if backend == "gloo" and devices:
        lines.append(f"distperf: gloo ranks with their tensors on the GPU: {GLOO_ON_GPU}")
    most = ranks_per_gpu(devices)
    if most > 1:
        how = (f" ({NCCL_SHARED_GPU_VARIABLE}=1, NCCL {version_text(nccl_version)}, "
               f"experimental)" if backend == "nccl" else "")
        lines.append(f"distperf: {most} ranks share a GPU{how}: they share its SMs and memory, "
                     f"so their times are not those of a rank per GPU; their baselines are "
                     f"kept apart ({most}pergpu in the key)")
    return lines


def resolve_thresholds(*layers: Mapping[str, float] | None) -> dict[str, float]:
    """The defaults overridden by each layer in turn (ini, environment, marker); keys that
    are not thresholds (``tolerance``, ``world_size``) are left out."""
    out = dict(DEFAULT_THRESHOLDS)
    for layer in layers:
        if layer:
            out.update({k: float(v) for k, v in layer.items() if k in DEFAULT_THRESHOLDS})
    return out


#: The run header's pointer to the docs.
DOCS_LINE = ("distperf: options in pytest --help; how to read this run: the README and docs/ "
             "of pytest-distperf")

# -- the options' help texts (pytest --help: one line each; docs/options.md says more) ----
HELP_ENABLE = "run the distributed performance tests (skipped without it)"
HELP_GPUS = "ranks per process group (default: visible GPUs, or 2 without any)"
HELP_BACKEND = "auto (NCCL with a GPU per rank, else gloo), nccl, gloo, gloo-cuda (on GPUs)"
HELP_SAVE = "save this run's results as the baselines instead of comparing"
HELP_BASELINES = "baseline folder (default: perf_baselines under the rootdir)"
HELP_TIMEOUT = f"seconds a call on the ranks may take before a hang (default {DEFAULT_TIMEOUT_S:g})"
HELP_JSON = "write every result and verdict as JSON to PATH"
HELP_TRACE = "folder for the merged traces of dist_profiler"
HELP_STRICT = "fail on inconclusive verdicts (too noisy to tell) too"
HELP_SAME_RANKS = "re-measure ddp_step_timer steps on the pool's ranks, not fresh ones"
HELP_ENV_NAME = "name the runner type: it keys the baselines in place of the machine's details"
HELP_BIND = "bind each gloo rank to its own cores (baselines are kept apart by it)"
HELP_SAVE_MEASUREMENTS = "most measurements a save takes of a controlled metric (default 12)"
HELP_TOLERANCE = "fail on a confirmed change larger than this fraction (default 0.10)"
HELP_EXACT_TOLERANCE = "how far an exact count may move from its baseline (default 0)"
HELP_MARKDOWN = "write a Markdown summary to PATH (and to $GITHUB_STEP_SUMMARY if set)"
HELP_PLOTS = "write PNG plots into DIR (needs matplotlib)"
HELP_EXPORT = "write every figure to PATH as FORMAT bmf or gab, for a history dashboard"
