"""pytest hooks, options, the ``distperf`` marker, the fixtures and the session object.

Loaded through the ``pytest11`` entry point in every pytest run of the environment, so torch
is imported only once ``--distperf`` is given.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf.config import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    MARKER_KEYWORDS,
    ConfigError,
    DistperfConfig,
    parse_backend,
    parse_bool,
    parse_fraction,
    parse_gpus,
    parse_timeout,
    place_ranks,
    validate_marker_kwargs,
)
from pytest_distperf.records import Environment, Metric, TestRecord, to_dict
from pytest_distperf.thresholds import check_thresholds, resolve_thresholds

HELP_ENABLE = "enable distributed performance tests (without it they are skipped)"
HELP_GPUS = ("ranks per process group, the world size (default: visible CUDA devices, "
             "or 2 where there are none)")
HELP_BACKEND = ("auto (default): NCCL with one GPU per rank when enough GPUs are visible, "
                "otherwise gloo on CPU; or nccl, gloo")
HELP_SAVE = "write this run's results as the new baselines instead of comparing against them"
HELP_BASELINES = "baseline folder (default: perf_baselines under the rootdir)"
HELP_TIMEOUT = (f"longest any one call on the ranks may take before they are declared hung, "
                f"in seconds (default {DEFAULT_TIMEOUT_S:g})")
HELP_JSON = "write a machine-readable report of every result and verdict to PATH"
HELP_TRACE = "folder for merged multi-rank traces written by dist_profiler"
HELP_STRICT = "treat inconclusive verdicts (too noisy to tell) as failures"
HELP_TOLERANCE = ("the change a baseline comparison must catch, relative (default 0.10); the "
                  "marker's tolerance and the baseline file's thresholds table override it")

SKIP_REASON = ("distributed performance test: run with --distperf to enable it "
               "(and --gpus N to choose the world size)")
FIXTURE_NAMES = ("nccl_group", "ddp_step_timer", "dist_profiler")

SESSION_KEY = pytest.StashKey["DistperfSession"]()
RECORD_KEY = pytest.StashKey[TestRecord]()

# (flag, ini name, kind, help); kind: "flag" (store_true), "str"
_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--distperf", "distperf", "flag", HELP_ENABLE),
    ("--gpus", "distperf_gpus", "str", HELP_GPUS),
    ("--distperf-backend", "distperf_backend", "str", HELP_BACKEND),
    ("--distperf-save", "distperf_save", "flag", HELP_SAVE),
    ("--distperf-baselines", "distperf_baselines", "str", HELP_BASELINES),
    ("--distperf-timeout", "distperf_timeout", "str", HELP_TIMEOUT),
    ("--distperf-json", "distperf_json", "str", HELP_JSON),
    ("--distperf-trace", "distperf_trace", "str", HELP_TRACE),
    ("--distperf-strict", "distperf_strict", "flag", HELP_STRICT),
    ("--distperf-tolerance", "distperf_tolerance", "str", HELP_TOLERANCE),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed performance tests (pytest-distperf)")
    for flag, ini, kind, help_text in _OPTIONS:
        dest = ini if ini.startswith("distperf") else f"distperf_{ini}"
        if kind == "flag":
            group.addoption(flag, action="store_true", default=None, dest=dest, help=help_text)
        else:
            group.addoption(flag, action="store", default=None, dest=dest,
                            metavar=flag.split("-")[-1].upper(), help=help_text)
        parser.addini(ini, help_text, type="string", default="")
    from pytest_distperf.config import DEFAULT_THRESHOLDS

    for name, default in DEFAULT_THRESHOLDS.items():
        parser.addini(f"distperf_{name}",
                      f"project-wide {name} threshold (default {default:g}); the baseline "
                      f"file's thresholds table and the distperf marker override it",
                      type="string", default="")


def _value(config: pytest.Config, flag: str, ini: str) -> tuple[Any, str]:
    """(value, where it came from): the command line wins over the ini file."""
    cli = config.getoption(ini)
    if cli is not None:
        return cli, f"{flag} on the command line"
    raw = config.getini(ini)
    if raw not in ("", None):
        return raw, f"{ini} in {config.inipath or 'the ini file'}"
    return None, "default"


def ini_thresholds(config: pytest.Config) -> dict[str, float]:
    """The thresholds set in the ini file (``distperf_max_imbalance = 0.2``); ConfigError
    naming the key, the value and the file when one is bad."""
    from pytest_distperf.config import DEFAULT_THRESHOLDS

    out: dict[str, float] = {}
    for name in DEFAULT_THRESHOLDS:
        key = f"distperf_{name}"
        raw = config.getini(key)
        if raw not in ("", None):
            out[name] = parse_fraction(raw, key, f"{key} in {config.inipath or 'the ini file'}")
    return out


def build_config(config: pytest.Config) -> DistperfConfig:
    """The frozen config; a bad value raises ConfigError naming the option and its source."""
    values: dict[str, Any] = {}
    for flag, ini, kind, _ in _OPTIONS:
        value, source = _value(config, flag, ini)
        if value is None:
            continue
        if kind == "flag":
            values[ini] = parse_bool(value, flag, source)
        elif ini == "distperf_gpus":
            values[ini] = parse_gpus(value, source)
        elif ini == "distperf_backend":
            values[ini] = parse_backend(value, source)
        elif ini == "distperf_timeout":
            values[ini] = parse_timeout(value, source)
        elif ini == "distperf_tolerance":
            values[ini] = parse_fraction(value, flag, source)
        else:
            path = Path(str(value)).expanduser()
            values[ini] = path if path.is_absolute() else Path(config.rootpath, path)
    return DistperfConfig(
        enabled=values.get("distperf", False),
        gpus=values.get("distperf_gpus"),
        backend=values.get("distperf_backend", "auto"),
        save=values.get("distperf_save", False),
        baselines_dir=values.get("distperf_baselines", Path(config.rootpath, "perf_baselines")),
        timeout_s=values.get("distperf_timeout", DEFAULT_TIMEOUT_S),
        json_path=values.get("distperf_json"),
        trace_dir=values.get("distperf_trace"),
        strict=values.get("distperf_strict", False),
        tolerance=values.get("distperf_tolerance", DEFAULT_TOLERANCE),
    )


def _in_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _xdist_slot() -> tuple[int, int]:
    """(this xdist worker's index, the number of workers); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]), max(count, 1)
    return 0, 1


class DistperfSession:
    """Everything distperf keeps for one pytest process: config, engine, records."""

    def __init__(self, cfg: DistperfConfig, config: pytest.Config) -> None:
        self.cfg = cfg
        self.config = config
        self.records: list[TestRecord] = []
        #: thresholds from the ini file: above the defaults, below baselines and markers
        self.ini_thresholds: dict[str, float] = {}
        self.world_size = cfg.gpus or 2
        self.backend = "gloo"
        self.device_type = "cpu"
        self.mode = "torchrun" if _in_torchrun() else "spawned"
        self.device_offset = 0
        self.visible_gpus = 0
        self._engine: Any = None
        self.is_reporter = True
        self.is_xdist_worker = hasattr(config, "workerinput")
        self._environments: dict[int, Environment] = {}
        self._baseline_files: dict[Path, Any] = {}

    # -- resolution (imports torch) -------------------------------------------------------
    def resolve(self) -> None:
        """Pick world size and backend from the devices present; UsageError when impossible."""
        import torch

        cfg = self.cfg
        cuda = torch.cuda.is_available()
        self.visible_gpus = torch.cuda.device_count() if cuda else 0
        if self.mode == "torchrun":
            backend = cfg.backend
            if backend == "auto":
                backend = "nccl" if self.visible_gpus > 0 else "gloo"
            if backend == "nccl" and self.visible_gpus == 0:
                raise pytest.UsageError(
                    "--distperf-backend nccl: no CUDA device is visible to this torchrun rank")
            from pytest_distperf.launcher import TorchrunEngine

            self._engine = TorchrunEngine(backend, cfg.timeout_s)
            self.world_size = self._engine.world_size
            self.backend = self._engine.backend
            self.device_type = self._engine.device_type
            self.is_reporter = self._engine.rank == 0
            return
        import torch.distributed as dist

        index, workers = _xdist_slot()
        nccl_ok = cuda and dist.is_available() and dist.is_nccl_available()
        try:
            placement = place_ranks(cfg.backend, cfg.gpus, self.visible_gpus, nccl_ok,
                                    index, workers)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.world_size = placement.world_size
        self.backend = placement.backend
        self.device_type = "cuda" if placement.backend == "nccl" else "cpu"
        self.device_offset = placement.device_offset

    # -- the engine -----------------------------------------------------------------------
    @property
    def engine(self) -> Any:
        if self._engine is None:
            from pytest_distperf.launcher import RankPool

            self._engine = RankPool(self.world_size, self.backend,
                                    device_offset=self.device_offset,
                                    timeout_s=self.cfg.timeout_s)
        return self._engine

    def environment(self, world_size: int | None = None) -> Environment:
        """The environment key of results measured on ``world_size`` ranks."""
        size = world_size or self.world_size
        if size not in self._environments:
            info = self.engine.rank_info()[0]
            self._environments[size] = Environment(
                backend=self.backend, device_type=self.device_type,
                device_model=info["device_model"],
                device_count=size if self.device_type == "cuda" else 0,
                world_size=size, torch_version=info["torch_version"],
                nccl_version=info["nccl_version"],
            )
        return self._environments[size]

    def header(self) -> str:
        import torch

        if self.mode == "torchrun":
            pool = f"torchrun's group (this is rank {self._engine.rank} of {self.world_size})"
        else:
            from pytest_distperf.launcher import threads_per_rank

            pool = (f"spawned on first use and kept for the session "
                    f"({threads_per_rank(self.world_size)} CPU threads per rank)")
        if self.device_type == "cuda":
            first = self.device_offset
            device = f"cuda (devices {first}..{first + self.world_size - 1} " \
                     f"of {self.visible_gpus} visible)"
        else:
            device = f"cpu ({os.cpu_count()} cores; {self.visible_gpus} CUDA devices visible)"
        return (f"distperf: {self.world_size} ranks, backend {self.backend}, device {device}, "
                f"torch {torch.__version__}, pool: {pool}")

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()

    # -- per test -------------------------------------------------------------------------
    def record_for(self, item: pytest.Item, world_size: int) -> TestRecord:
        record = item.stash.get(RECORD_KEY, None)
        if record is None:
            record = TestRecord(nodeid=item.nodeid, world_size=world_size)
            item.stash[RECORD_KEY] = record
            self.records.append(record)
        return record

    def judge(self, item: pytest.Item, record: TestRecord,
              noise_window: Any = None) -> str | None:
        """Check the test's metrics against the thresholds and the stored baselines (or save
        them with --distperf-save); the failure text, or None when the test passes.

        ``noise_window`` holds the noise probe's figures of the test call
        (:class:`~pytest_distperf.noise.NoiseFigures`).
        """
        from pytest_distperf import baseline

        marker = marker_settings(item)
        env = self.environment(record.world_size)
        file, file_error = None, ""
        if self.is_reporter:
            try:
                file = self.baseline_file(item.nodeid)
            except baseline.BaselineError as exc:
                file_error = str(exc)
        env_layer = file.thresholds(baseline.environment_id(env)) if file is not None else {}
        limits = resolve_thresholds(self.ini_thresholds, env_layer, marker)
        breaches = check_thresholds(record.metrics, limits)
        record.breaches = [b.describe() for b in breaches]
        lines = []
        if breaches:
            lines = [f"distperf: {len(breaches)} threshold breach(es) in {item.nodeid}:"]
            lines += [f"  {b.describe()}" for b in breaches]
        tolerance = float(marker.get("tolerance", env_layer.get("tolerance", self.cfg.tolerance)))
        lines += self._baseline_verdicts(item, record, file, file_error, tolerance, noise_window)
        return "\n".join(lines) if lines else None

    # -- baselines ------------------------------------------------------------------------
    @property
    def baselines_root(self) -> Path:
        return self.cfg.baselines_dir or Path(self.config.rootpath, "perf_baselines")

    def baseline_file(self, nodeid: str) -> Any:
        """The parsed baseline file of ``nodeid``'s module (None when there is none yet);
        BaselineError when it cannot be read.  Read once per session."""
        from pytest_distperf import baseline

        path = baseline.baseline_path(self.baselines_root, nodeid)
        if path not in self._baseline_files:
            self._baseline_files[path] = baseline.load(path)
        return self._baseline_files[path]

    def _measured_pids(self) -> list[int]:
        """The processes a measurement runs in (the ranks), for the noise probe."""
        if self.mode == "torchrun":
            return [os.getpid()]
        engine = self._engine
        if engine is None or not getattr(engine, "alive", False):
            return []
        return list(engine.pids())

    def noise_snapshot(self) -> Any:
        from pytest_distperf import noise

        return noise.snapshot(self._measured_pids())

    def noise_since(self, start: Any) -> Any:
        from pytest_distperf import noise

        return noise.between(start, noise.snapshot(self._measured_pids()))

    def _agree(self, labels: list[str]) -> list[str]:
        """Under torchrun every rank must re-measure together: rank 0's choice wins."""
        if self.mode != "torchrun":
            return labels
        return list(self.engine.execute(_echo, (labels,), {}, self.engine.world_size,
                                        "distperf: agreeing on re-measurements")[0])

    def _baseline_verdicts(self, item: pytest.Item, record: TestRecord, file: Any,
                           file_error: str, tolerance: float, noise_window: Any) -> list[str]:
        """Compare with (or save as) the baselines; the failure lines (none: it passes).

        Every metric of a test is keyed by the test's environment (its group size), also
        those measured on a subgroup, such as a scaling sweep's ``.w1`` points: the sweep
        depends on the size of the run.
        """
        from pytest_distperf import baseline, report

        env = self.environment(record.world_size)
        module, test = baseline.split_nodeid(item.nodeid)
        judgement = None
        if self.is_reporter and not file_error:
            judgement = baseline.Judgement(
                metrics=record.metrics, labels=record.metric_labels,
                environments={m.name: env for m in record.metrics},
                first_noise=noise_window, tolerance=tolerance, save=self.cfg.save,
                baseline=file, test=test, remeasurable=list(record.remeasure))
        for _ in range(baseline.MAX_ROUNDS):
            labels = self._agree(judgement.wanted() if judgement is not None else [])
            if not labels:
                break
            if judgement is not None:
                time.sleep(judgement.backoff())
            for label in labels:
                start = self.noise_snapshot()
                fresh = list(record.remeasure[label]())
                figures = self.noise_since(start)
                if judgement is not None:
                    judgement.add_window(label, fresh, figures)
        if file_error:
            return [file_error]
        if judgement is None:
            return []
        path = baseline.baseline_path(self.baselines_root, item.nodeid)
        if self.cfg.save:
            try:
                baseline.save_test(path, module, test, judgement.save_entries())
            except baseline.BaselineError as exc:
                return [str(exc)]
            except OSError as exc:
                return [f"distperf: cannot write the baseline file {path}: {exc}"]
            self._baseline_files.pop(path, None)
        record.verdicts = judgement.verdicts()
        failing = {baseline.REGRESSED} | ({baseline.INCONCLUSIVE} if self.cfg.strict else set())
        bad = [v for v in record.verdicts if v.verdict in failing]
        shown = report.verdict_report(record.verdicts, item.nodeid, path)
        if shown and not bad:  # a failure shows its own table
            item.add_report_section("call", "distperf", "\n".join(shown))
        inconclusive = [v for v in record.verdicts if v.verdict == baseline.INCONCLUSIVE]
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


def _echo(value: Any) -> Any:
    return value


def get_session(config: pytest.Config) -> DistperfSession:
    return config.stash[SESSION_KEY]


# -- hooks ----------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "distperf(world_size=None, max_comm_overhead=None, max_imbalance=None, "
        "min_scaling_efficiency=None, tolerance=None): a distributed performance test; "
        "overrides the group size and thresholds for this test",
    )
    try:
        cfg = build_config(config)
        thresholds = ini_thresholds(config)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = DistperfSession(cfg, config)
    session.ini_thresholds = thresholds
    config.stash[SESSION_KEY] = session
    if cfg.enabled:
        session.resolve()


def pytest_report_header(config: pytest.Config) -> str:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.cfg.enabled:
        return "distperf: disabled (distributed performance tests are skipped; use --distperf)"
    return session.header()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None and session.cfg.enabled:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if is_distperf_test(item):
            item.add_marker(skip)


def is_distperf_test(item: pytest.Item) -> bool:
    """Whether the test uses a distperf fixture or carries the ``distperf`` marker."""
    names = getattr(item, "fixturenames", ())
    return bool(item.get_closest_marker("distperf")) or any(n in names for n in FIXTURE_NAMES)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    try:
        marker_settings(item)
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session = item.config.stash.get(SESSION_KEY, None)
    start = None
    if session is not None and session.cfg.enabled and is_distperf_test(item):
        start = session.noise_snapshot()
    result = yield
    record = item.stash.get(RECORD_KEY, None)
    if session is not None and record is not None and record.metrics:
        failure = session.judge(item, record, session.noise_since(start))
        if failure:
            pytest.fail(failure, pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.cfg.enabled or not session.is_reporter:
        return
    from pytest_distperf import report

    records = session.records + _records_from_xdist_workers(config)
    if not records:
        return
    tables = report.collective_lines(records)
    if tables:
        terminalreporter.write_sep("=", "distperf collectives (nccl-tests style)")
        for line in tables:
            terminalreporter.write_line(line)
    terminalreporter.write_sep("=", "distperf summary")
    for line in report.summary_lines(records):
        terminalreporter.write_line(line)
    for line in report.verdict_summary_lines(records):
        terminalreporter.write_line(line)
    if session.cfg.json_path is not None:
        try:
            report.write_json(session.cfg.json_path, records, header=session.header())
        except OSError as exc:
            terminalreporter.write_line(
                f"distperf: cannot write the JSON report to {session.cfg.json_path}: {exc}",
                red=True)
        else:
            terminalreporter.write_line(
                f"distperf: JSON report written to {session.cfg.json_path}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # xdist sends a worker's workeroutput right after this hook (its own sessionfinish
    # wrapper), before pytest_unconfigure: the records must be there by now.
    dp = session.config.stash.get(SESSION_KEY, None)
    if dp is not None and dp.is_xdist_worker:
        session.config.workeroutput["distperf_records"] = [  # type: ignore[attr-defined]
            to_dict(r) for r in dp.records]


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    session.close()


# -- pytest-xdist: workers send their records to the controller for the summary ------------
_XDIST_RECORDS = pytest.StashKey[list[TestRecord]]()


def _records_from_xdist_workers(config: pytest.Config) -> list[TestRecord]:
    return config.stash.get(_XDIST_RECORDS, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    from pytest_distperf.records import from_dict

    output = getattr(node, "workeroutput", {}) or {}
    records = [from_dict(TestRecord, r) for r in output.get("distperf_records", [])]
    config = node.config
    config.stash[_XDIST_RECORDS] = config.stash.get(_XDIST_RECORDS, []) + records


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture
def nccl_group(request: pytest.FixtureRequest) -> Any:
    """A live process group of ``--gpus`` ranks (or the marker's ``world_size``), kept for the
    session: ``run(fn, *args, **kwargs)`` on every rank, ``bench(op, sizes)``."""
    return make_group(request)


@pytest.fixture
def ddp_step_timer(request: pytest.FixtureRequest) -> Any:
    """Time DDP/FSDP2 training steps on the group: ``ddp_step_timer(model_fn, batch_fn,
    steps=20, warmup=3, world_size=None, loss_fn=None, wrapper="ddp") -> StepTiming`` and
    ``ddp_step_timer.scaling(model_fn, batch_fn, world_sizes=(1, 2, 4), mode="weak")``."""
    from pytest_distperf.steptimer import DDPStepTimer

    group = make_group(request)
    return DDPStepTimer(group, limits_for(request.node))


@pytest.fixture
def dist_profiler(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Profile a function on every rank: ``dist_profiler(fn, *args, world_size=None,
    **kwargs) -> ProfileReport``; the ranks' traces are merged into one Chrome/Perfetto file
    in ``--distperf-trace DIR`` (default: the test's ``tmp_path``)."""
    from pytest_distperf.profiler import DistProfiler

    session = get_session(request.config)
    group = make_group(request)
    return DistProfiler(group, trace_dir=session.cfg.trace_dir or tmp_path,
                        nodeid=request.node.nodeid,
                        limits=limits_for(request.node),
                        write=session.is_reporter)


def limits_for(item: pytest.Item) -> dict[str, float]:
    """The thresholds a fixture's analysis uses: defaults, the ini file, the test's marker
    (the verdict also applies the baseline file's table for the environment)."""
    return resolve_thresholds(get_session(item.config).ini_thresholds, marker_settings(item))


def make_group(request: pytest.FixtureRequest) -> Any:
    """The test's :class:`~pytest_distperf.group.DistGroup`, recording into its record."""
    from pytest_distperf.group import DistGroup

    session = get_session(request.config)
    item = request.node
    try:
        size = int(marker_settings(item).get("world_size", session.world_size))
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
    if size > session.world_size:
        pytest.fail(
            f"@pytest.mark.distperf(world_size={size}) is larger than the {session.world_size} "
            f"ranks of this run; run with --gpus {size} or more", pytrace=False)

    def recorder(label: str, metrics: Sequence[Metric], result: Any,
                 remeasure: Any = None) -> None:
        record = session.record_for(item, size)
        record.metrics.extend(metrics)
        record.metric_labels.update((m.name, label) for m in metrics)
        if remeasure is not None:
            record.remeasure[label] = remeasure
        if result is not None:
            data = to_dict(result) if dataclasses.is_dataclass(result) else result
            record.results.append({"label": label, "result": data})

    # Start the pool now, before the test body: the noise probe of the test call needs the
    # ranks' pids at its start, and a pool spawning inside a measured window is noise itself.
    session.engine.rank_info()
    return DistGroup(session.engine, size, recorder=recorder,
                     module=getattr(request, "module", None))
