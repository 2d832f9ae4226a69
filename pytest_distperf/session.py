"""The controller's session: what distperf keeps for one pytest process, and how a test's
recorded measurements become its verdict.  :class:`DistperfSession` owns the config, the
engine (the rank pool or torchrun's group), the environment key, the test records and the
baseline files read so far.  Per test it resolves the limits once
(:meth:`DistperfSession.limits_for`), and when the test body ends it checks the thresholds
and compares with (or saves) the baselines (:meth:`DistperfSession.judge`).  torch is
imported only inside methods.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_distperf.config import (
    DEFAULT_BASELINES_DIRNAME,
    MARKER_KEYWORDS,
    NCCL_SHARED_GPU_VARIABLE,
    ConfigError,
    DistperfConfig,
    describe_devices,
    place_ranks,
    placement_notes,
    resolve_thresholds,
    validate_marker_kwargs,
)
from pytest_distperf.pool.launcher import RankPool, fork_server, rank_cores, threads_per_rank
from pytest_distperf.records import (
    INCONCLUSIVE,
    REGRESSED,
    Environment,
    Measurement,
    Metric,
    TestRecord,
    Verdict,
    distinct,
)
from pytest_distperf.verdict import noise
from pytest_distperf.verdict.environment import environment_of, save_warnings, with_pin_advice
from pytest_distperf.verdict.thresholds import check_thresholds

if TYPE_CHECKING:  # the verdict's rule and store need numpy: imported where they are used
    from pytest_distperf.doctor.nvml import Clocks
    from pytest_distperf.verdict.judgement import Remeasured
    from pytest_distperf.verdict.store import BaselineFile, SessionFiles

SESSION_KEY = pytest.StashKey["DistperfSession"]()
RECORD_KEY = pytest.StashKey[TestRecord]()
LIMITS_KEY = pytest.StashKey["TestLimits"]()


@dataclasses.dataclass(frozen=True, slots=True)
class TestLimits:
    """The limits of one test, resolved once: the thresholds (defaults, ini file, the
    baseline file's table for this environment, the marker, in that order), the tolerance
    and the exact tolerance; and the baseline file they came from (or why it could not be
    read)."""

    __test__ = False  # not a pytest test class

    thresholds: dict[str, float]
    tolerance: float
    environment: Environment
    file: BaselineFile | None
    file_error: str = ""
    exact_tolerance: float = 0.0


def marker_settings(item: pytest.Item) -> dict[str, float | int]:
    """The validated keywords of the test's ``distperf`` markers (ConfigError when bad).

    Markers merge: a module's ``pytestmark`` sets limits for every test in it, and a test's
    own marker overrides them keyword by keyword.
    """
    merged: dict[str, object] = {}
    for marker in reversed(list(item.iter_markers("distperf"))):  # farthest first
        if marker.args:
            raise ConfigError(
                f"@pytest.mark.distperf on {item.nodeid}: takes keywords only "
                f"({', '.join(MARKER_KEYWORDS)}), got positional {marker.args!r}")
        merged.update(marker.kwargs)
    return validate_marker_kwargs(merged, item.nodeid)


def _in_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def hands_out_tests(config: pytest.Config) -> bool:
    """Whether this process is an xdist controller that hands its tests to workers (xdist's
    own test: a distribution mode and workers to start): it runs none of them."""
    return (config.getoption("dist", "no") != "no"
            and bool(config.getoption("tx", None)))


def _xdist_slot() -> tuple[int, int]:
    """(this xdist worker's index, the number of workers); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]), max(count, 1)
    return 0, 1


def _nccl_version() -> tuple[int, ...]:
    """The NCCL this torch runs, e.g. (2, 21, 5); () where it cannot tell."""
    import torch

    try:
        return tuple(int(v) for v in torch.cuda.nccl.version()[:3])
    except Exception:  # an NCCL that does not load, or an old torch's integer: unknown
        return ()


def _echo(value: Any) -> Any:
    return value


def baseline_key(item: pytest.Item) -> str:
    """``module::test`` naming the test in the baseline files: the module is the test file's
    path relative to the rootdir, also for files outside it (``../other/test_x.py``, stored
    under ``__/other/``), where pytest's node id has no module at all (``::test_a``)."""
    _, _, test = item.nodeid.partition("::")
    path = getattr(item, "path", None)
    if path is None:
        return item.nodeid
    module = Path(os.path.relpath(path, item.config.rootpath)).as_posix()
    return f"{module}::{test}" if test else module


#: The exit status after SIGTERM, as a shell reports a process it ended (128 + 15).
SIGTERM_STATUS = 128 + signal.SIGTERM


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (what ``timeout``, a cancelled CI job and ``scancel`` send) ends the session
    the way Ctrl-C does: with a message, the summary, the pool stopped and its files
    removed.  A second SIGTERM ends the process at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pytest.exit("distperf: SIGTERM received: the session stops here; the rank pool is "
                "stopped and its files removed", returncode=SIGTERM_STATUS)


class DistperfSession:
    """Everything distperf keeps for one pytest process: config, engine, records."""

    def __init__(self, cfg: DistperfConfig, config: pytest.Config,
                 ini_thresholds: dict[str, float] | None = None) -> None:
        self.cfg = cfg
        self.config = config
        self.records: list[TestRecord] = []
        #: thresholds from the ini file: above the defaults, below baselines and markers
        self.ini_thresholds = dict(ini_thresholds or {})
        self.world_size = cfg.gpus or 2
        self.backend = "gloo"
        self.device_type = "cpu"
        self.mode = "torchrun" if _in_torchrun() else "spawned"
        self.devices: tuple[int, ...] = ()  # each rank's CUDA device; () for CPU ranks
        self.visible_gpus = 0
        self.nccl_version: tuple[int, ...] = ()
        self._engine: Any = None
        self._fresh_ranks_failed = False  # fresh ranks did not start: not tried again
        self.is_reporter = True
        self.is_xdist_worker = hasattr(config, "workerinput")
        #: an xdist controller runs no test: no ranks, so no fork server for them
        self.hands_out_tests = not self.is_xdist_worker and hands_out_tests(config)
        self._environments: dict[int, Environment] = {}
        self._baselines: SessionFiles | None = None

    # -- resolution (imports torch) -------------------------------------------------------
    def resolve(self) -> None:
        """Pick world size and backend from the devices present; UsageError when impossible."""
        if self.mode != "torchrun" and not self.hands_out_tests:
            fork_server()  # its import of torch beside the controller's
        import torch

        cfg = self.cfg
        cuda = torch.cuda.is_available()
        self.visible_gpus = torch.cuda.device_count() if cuda else 0
        if self.mode == "torchrun":
            backend = cfg.backend
            if backend == "auto":
                backend = "nccl" if self.visible_gpus > 0 else "gloo"
            if backend in ("nccl", "gloo-cuda") and self.visible_gpus == 0:
                raise pytest.UsageError(
                    f"--distperf-backend {backend}: no CUDA device is visible to this "
                    f"torchrun rank")
            from pytest_distperf.pool.torchrun import TorchrunEngine

            self._engine = TorchrunEngine(backend, cfg.timeout_s)
            self.world_size = self._engine.world_size
            self.backend = self._engine.backend
            self.device_type = self._engine.device_type
            self.is_reporter = self._engine.rank == 0
            return
        import torch.distributed as dist

        index, workers = _xdist_slot()
        nccl_ok = cuda and dist.is_available() and dist.is_nccl_available()
        self.nccl_version = _nccl_version() if nccl_ok else ()
        try:
            placement = place_ranks(
                cfg.backend, cfg.gpus, self.visible_gpus, nccl_ok, index, workers,
                nccl_version=self.nccl_version,
                shared_gpus=os.environ.get(NCCL_SHARED_GPU_VARIABLE, "") == "1")
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.world_size = placement.world_size
        self.backend = placement.backend
        self.device_type = placement.device_type
        self.devices = placement.devices

    # -- the engine -----------------------------------------------------------------------
    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = RankPool(self.world_size, self.backend, devices=self.devices,
                                    timeout_s=self.cfg.timeout_s, bind=self.cfg.bind_ranks)
            self._handle_sigterm()
        return self._engine

    def _handle_sigterm(self) -> None:
        """Turn SIGTERM into a clean end of the session (:func:`_on_sigterm`) while this
        process owns a pool; only where nobody else handles SIGTERM."""
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            signal.signal(signal.SIGTERM, _on_sigterm)

    def environment(self, world_size: int | None = None) -> Environment:
        """The environment key of results measured on ``world_size`` ranks."""
        size = world_size or self.world_size
        if size not in self._environments:
            self._environments[size] = environment_of(
                self.engine.rank_info()[:size], self.backend, self.device_type, size,
                self.cfg.env_name)
        return self._environments[size]

    def header(self) -> str:
        import torch

        if self.mode == "torchrun":
            pool = f"torchrun's group (this is rank {self._engine.rank} of {self.world_size})"
        else:
            bound = (self.cfg.bind_ranks
                     and rank_cores(self.world_size, self.device_type) is not None)
            pool = (f"spawned on first use and kept for the session "
                    f"({threads_per_rank(self.world_size)} CPU threads per rank"
                    f"{', each rank bound to its own cores' if bound else ''})")
        devices: tuple[int, ...] = ()
        if self.device_type == "cuda":
            devices = self.devices or tuple(range(self.world_size))  # torchrun: one per rank
            device = f"cuda ({describe_devices(devices, self.visible_gpus)})"
        else:
            device = f"cpu ({os.cpu_count()} cores; {self.visible_gpus} CUDA devices visible)"
        text = (f"distperf: {self.world_size} ranks, backend {self.backend}, device {device}, "
                f"torch {torch.__version__}, pool: {pool}")
        for note in placement_notes(self.backend, devices, self.nccl_version):
            text += f"\n{note}"
        if self.cfg.env_name:
            text += (f"\ndistperf: environment name {self.cfg.env_name!r} (pinned: it keys the "
                     f"baselines in place of this machine's details)")
        cores = os.cpu_count() or 1
        if self.device_type == "cpu" and self.mode != "torchrun" and self.world_size > cores:
            text += (f"\ndistperf: warning: {self.world_size} ranks on {cores} CPU cores: the "
                     f"ranks take turns on the cores, so timings are slower and noisier than "
                     f"with a core per rank (fine for a smoke run; use --gpus {cores} or fewer "
                     f"for figures to keep)")
        return text

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is _on_sigterm):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    # -- the noise probe ------------------------------------------------------------------
    def _measured_pids(self) -> list[int]:
        """The processes a measurement runs in (the pool's ranks), for the noise probe; none
        under torchrun, where the probe finds the local ranks itself (this rank and its
        agent's other children)."""
        if self.mode == "torchrun":
            return []
        engine = self._engine
        if engine is None or not getattr(engine, "alive", False):
            return []
        return list(engine.pids())

    def _gpu_clocks(self) -> Clocks | None:
        """How long this host's GPUs of the ranks were held below their clocks, and their SM
        clocks (NVML), for the noise probe; None on CPU ranks."""
        engine = self._engine
        if self.device_type != "cuda" or engine is None or not getattr(engine, "alive", True):
            return None
        from pytest_distperf.doctor.nvml import clocks

        host = socket.gethostname()
        gpus = sorted({(int(info["device_index"]), str(info.get("uuid", "")))
                       for info in engine.rank_info()
                       if info.get("device_index", -1) >= 0 and info.get("hostname") == host})
        return clocks(gpus) if gpus else None

    def noise_snapshot(self) -> noise.Snapshot:
        gpu = self._gpu_clocks()
        return noise.snapshot(self._measured_pids(), local_ranks=self.mode == "torchrun",
                              held_ns=None if gpu is None else gpu.held_ns,
                              sm_clock_mhz=None if gpu is None else gpu.sm_clock_mhz)

    def noise_since(self, start: noise.Snapshot) -> noise.NoiseFigures:
        return noise.between(start, self.noise_snapshot())

    # -- per test -------------------------------------------------------------------------
    def record_for(self, item: pytest.Item, world_size: int) -> TestRecord:
        record = item.stash.get(RECORD_KEY, None)
        if record is None:
            record = TestRecord(nodeid=item.nodeid, world_size=world_size)
            item.stash[RECORD_KEY] = record
            self.records.append(record)
        return record

    def add_measurement(self, item: pytest.Item, world_size: int,
                        measurement: Measurement) -> None:
        """A fixture's measurement, recorded under the test for its verdict (a repeated
        label or metric name gets ``#2``, ... : :func:`~pytest_distperf.records.distinct`)."""
        record = self.record_for(item, world_size)
        record.measurements.append(distinct(measurement, record.measurements))

    @property
    def baselines_root(self) -> Path:
        return self.cfg.baselines_dir or Path(self.config.rootpath, DEFAULT_BASELINES_DIRNAME)

    @property
    def baselines(self) -> SessionFiles:
        """The session's baseline files: read once each, saves written per module."""
        if self._baselines is None:
            from pytest_distperf.verdict.store import SessionFiles
            self._baselines = SessionFiles(self.baselines_root, sweep=self.is_reporter)
        return self._baselines

    def write_saves(self, next_item: pytest.Item | None) -> str:
        """Write the saves into every baseline file but the next test's; the errors."""
        files, keep = self._baselines, baseline_key(next_item) if next_item else None
        return "\n".join(files.write(keep)) if files is not None else ""

    def session_end(self, session: pytest.Session, records: list[TestRecord]) -> None:
        """Write the saves left; fail the run for that, or for a dark gate if strict."""
        from pytest_distperf.report.terminal import dark
        if failure := self.write_saves(None):
            self.config.get_terminal_writer().line(failure, red=True)
        if session.exitstatus == 0 and (failure or (self.cfg.strict and dark(records))):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def limits_for(self, item: pytest.Item, world_size: int) -> TestLimits:
        """The test's limits, resolved on first use and kept for the test (ConfigError for
        a bad marker)."""
        from pytest_distperf.verdict.store import BaselineError, environment_id

        limits = item.stash.get(LIMITS_KEY, None)
        if limits is not None:
            return limits
        marker = marker_settings(item)
        env = self.environment(world_size)
        file, file_error = None, ""
        try:
            file = self.baselines.file(baseline_key(item))
        except BaselineError as exc:
            file_error = str(exc)
        env_layer = file.thresholds(environment_id(env)) if file is not None else {}
        limits = TestLimits(
            thresholds=resolve_thresholds(self.ini_thresholds, env_layer, marker),
            tolerance=float(marker.get("tolerance",
                                       env_layer.get("tolerance", self.cfg.tolerance))),
            environment=env, file=file, file_error=file_error,
            exact_tolerance=float(marker.get(
                "exact_tolerance", env_layer.get("exact_tolerance", self.cfg.exact_tolerance))))
        item.stash[LIMITS_KEY] = limits
        return limits

    def judge(self, item: pytest.Item, record: TestRecord,
              noise_window: noise.NoiseFigures | None = None) -> str | None:
        """Check the test's metrics against the thresholds and the stored baselines (or save
        them with --distperf-save); the failure text, or None when the test passes.

        ``noise_window`` holds the noise probe's figures of the test call.
        """
        limits = self.limits_for(item, record.world_size)
        noisy = noise_window.too_noisy() if noise_window is not None else []
        breaches = check_thresholds(record.metrics, limits.thresholds, noisy)
        record.breaches = [b.describe() for b in breaches]
        failing = [b for b in breaches if self.cfg.strict or not b.inconclusive]
        doubtful = [b for b in breaches if b not in failing]
        if doubtful:
            item.warn(pytest.PytestWarning(
                "distperf: threshold breach too noisy to tell (not a failure without "
                "--distperf-strict): " + "; ".join(b.describe() for b in doubtful)))
        lines = []
        if failing:
            lines = [f"distperf: {len(failing)} threshold breach(es) in {item.nodeid}:"]
            lines += [f"  {b.describe()}" for b in failing]
        lines += self._baseline_verdicts(item, record, limits, noise_window)
        return "\n".join(lines) if lines else None

    # -- baselines ------------------------------------------------------------------------
    def _agree(self, labels: list[str]) -> list[str]:
        """Under torchrun every rank must re-measure together: rank 0's choice wins."""
        if self.mode != "torchrun":
            return labels
        return list(self.engine.execute(_echo, (labels,), {}, self.engine.world_size,
                                        "distperf: agreeing on re-measurements")[0])

    def _fresh_ranks(self) -> bool:
        """Whether re-measurements that allow it run on fresh ranks: a spawned pool of CPU
        ranks (a second set of processes on the same GPUs would share them, and torchrun's
        group is the job's), unless --distperf-same-ranks or they failed to start once."""
        return (not self.cfg.same_ranks and not self._fresh_ranks_failed
                and self.mode == "spawned" and self.device_type == "cpu")

    def _remeasure(self, item: pytest.Item, record: TestRecord
                   ) -> tuple[Callable[[str], Remeasured],
                              Callable[[list[str]], contextlib.AbstractContextManager[float]],
                              Callable[[], set[str]]]:
        """``remeasure(label)`` and ``each_round(labels)`` for
        :func:`~pytest_distperf.verdict.judgement.settle`, and ``on_fresh()``, the labels
        whose every re-measurement so far ran on fresh ranks: the test's own measurement,
        repeated under the noise probe; a measurement that sets up all it needs
        (``Measurement.fresh_ranks``) on a pool of fresh ranks started for the round, which
        leaves the session's pool, and what earlier calls left on its ranks, as it was.  Each
        set of rank processes runs at its own speed, a few percent apart, however long it is
        measured (benchmarks/log/statistics.md, item 9)."""
        measurements = {m.label: m for m in record.measurements if m.remeasure is not None}
        side: list[Any] = []  # this round's fresh pool, if it has one
        where: dict[str, list[bool]] = {}  # per label: each re-measurement on fresh ranks?

        @contextlib.contextmanager
        def each_round(labels: list[str]) -> Iterator[float]:
            started = time.monotonic()
            if self._fresh_ranks() and any(measurements[label].fresh_ranks for label in labels):
                from pytest_distperf.pool.launcher import RankError

                pool = self.engine.sibling()
                try:
                    pool.start()
                    side.append(pool)
                except (RankError, OSError) as exc:
                    self._fresh_ranks_failed = True
                    item.warn(pytest.PytestWarning(
                        f"distperf: fresh ranks to re-measure on did not start ({exc}); "
                        "this session re-measures on the pool's own ranks"))
            try:
                yield time.monotonic() - started
            finally:
                while side:
                    side.pop().close()

        def remeasure(label: str) -> Remeasured:
            measurement = measurements[label]
            again = measurement.remeasure
            assert again is not None
            on_fresh = bool(side) and measurement.fresh_ranks
            where.setdefault(label, []).append(on_fresh)
            with (self.engine.routed_to(side[0]) if on_fresh else contextlib.nullcontext()):
                start = self.noise_snapshot()
                fresh: list[Metric] = list(again())
                return fresh, self.noise_since(start)

        def on_fresh() -> set[str]:
            return {label for label, each in where.items() if all(each)}

        return remeasure, each_round, on_fresh

    def _baseline_verdicts(self, item: pytest.Item, record: TestRecord, limits: TestLimits,
                           noise_window: noise.NoiseFigures | None) -> list[str]:
        """Compare with (or save as) the baselines; the failure lines (none: it passes).

        Every metric of a test is keyed by the test's environment (its group size), also
        those measured on a subgroup, such as a scaling sweep's ``.w1`` points: the sweep
        depends on the size of the run.
        """
        from pytest_distperf.verdict.judgement import MAX_ROUNDS, Save, make_judgement, settle
        from pytest_distperf.verdict.store import split_nodeid

        key = baseline_key(item)
        _, test = split_nodeid(key)
        judgement = None
        if self.is_reporter and not limits.file_error:
            judgement = make_judgement(
                save=self.cfg.save, measurements=record.measurements,
                environment=limits.environment, first_noise=noise_window,
                tolerance=limits.tolerance, baseline=limits.file, test=test,
                exact_tolerance=limits.exact_tolerance,
                save_measurements=self.cfg.save_measurements)
        remeasure, each_round, on_fresh = self._remeasure(item, record)
        # a save may take more measurements than a comparison (every rank the same)
        rounds = max(MAX_ROUNDS, self.cfg.save_measurements + 1)
        settle(judgement, remeasure, agree=self._agree, sleep=time.sleep,
               each_round=each_round, rounds=rounds)
        if judgement is not None:
            judgement.fresh_labels = on_fresh()
        if not self.is_reporter:
            return []
        if limits.file_error:
            return [limits.file_error]
        assert judgement is not None
        path = self.baselines.path(key)
        file, env = limits.file, limits.environment
        stored = (file.environments(), file.test_environments(test)) if file else ({}, [])
        if isinstance(judgement, Save):  # written when the module's tests are done
            self.baselines.save(key, judgement.save_entries())
            for warning in save_warnings(env, *stored, str(path), os.environ):
                item.warn(pytest.PytestWarning(warning))
        record.verdicts = with_pin_advice(judgement.verdicts(), *stored, env,
                                          skip=set(judgement.unusable))
        return self._verdict_lines(item, record.verdicts, path, limits.tolerance)

    def _verdict_lines(self, item: pytest.Item, verdicts: list[Verdict], path: Path,
                       tolerance: float) -> list[str]:
        """Show the verdicts; the failure lines (none: the test passes)."""
        from pytest_distperf.report import terminal as report

        failing = {REGRESSED} | ({INCONCLUSIVE} if self.cfg.strict else set())
        bad = [v for v in verdicts if v.verdict in failing]
        shown = report.verdict_report(verdicts, item.nodeid, path)
        if shown and not bad:  # a failure shows its own table
            item.add_report_section("call", "distperf", "\n".join(shown))
        inconclusive = [v for v in verdicts if v.verdict == INCONCLUSIVE]
        if inconclusive and not self.cfg.strict:
            item.warn(pytest.PytestWarning(
                "distperf: inconclusive (too noisy to tell, not a failure without "
                "--distperf-strict): " + "; ".join(f"{v.metric}: {v.detail}"
                                                    for v in inconclusive)))
        if not bad:
            return []
        kinds = " and ".join(sorted({v.verdict for v in bad}, reverse=True))
        return [f"distperf: {kinds} in {item.nodeid} (tolerance {tolerance:.0%}):",
                *report.verdict_table(bad), f"  baselines: {path}"]
