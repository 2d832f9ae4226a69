"""pytest hooks, options, the ``distperf`` marker and the fixtures.

Loaded through the ``pytest11`` entry point in every pytest run of the environment, so torch
is imported only inside functions, once ``--distperf`` is given.  The session object lives in
:mod:`pytest_distperf.session`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf.config import (
    DEFAULT_BASELINES_DIRNAME,
    DEFAULT_EXACT_TOLERANCE,
    DEFAULT_SAVE_MEASUREMENTS,
    DEFAULT_THRESHOLDS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    DOCS_LINE,
    HELP_BACKEND,
    HELP_BASELINES,
    HELP_BIND,
    HELP_ENABLE,
    HELP_ENV_NAME,
    HELP_EXACT_TOLERANCE,
    HELP_EXPORT,
    HELP_GPUS,
    HELP_JSON,
    HELP_MARKDOWN,
    HELP_PLOTS,
    HELP_SAME_RANKS,
    HELP_SAVE,
    HELP_SAVE_MEASUREMENTS,
    HELP_STRICT,
    HELP_TIMEOUT,
    HELP_TOLERANCE,
    HELP_TRACE,
    ConfigError,
    DistperfConfig,
    parse_backend,
    parse_bool,
    parse_env_name,
    parse_fraction,
    parse_gpus,
    parse_path,
    parse_save_measurements,
    parse_timeout,
    parse_tolerance,
)
from pytest_distperf.fixtures.results import record_from_dict, record_to_dict
from pytest_distperf.records import (
    Environment,
    Measurement,
    Metric,
    Remeasure,
    TestRecord,
    from_dict,
    to_dict,
)
from pytest_distperf.report.outputs import Outputs
from pytest_distperf.session import (
    LIMITS_KEY,
    RECORD_KEY,
    SESSION_KEY,
    DistperfSession,
    TestLimits,
    marker_settings,
)

SKIP_REASON = ("distributed performance test: run with --distperf to enable it "
               "(and --gpus N to choose the world size)")
FIXTURE_NAMES = ("nccl_group", "ddp_step_timer", "dist_profiler")

# (flag, ini name, kind, help); kind: "flag" (store_true), "str"
_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--distperf", "distperf", "flag", HELP_ENABLE),
    ("--gpus", "distperf_gpus", "str", HELP_GPUS),
    ("--distperf-backend", "distperf_backend", "str", HELP_BACKEND),
    ("--distperf-save", "distperf_save", "flag", HELP_SAVE),
    ("--distperf-baselines", "distperf_baselines", "str", HELP_BASELINES),
    ("--distperf-env-name", "distperf_env_name", "str", HELP_ENV_NAME),
    ("--distperf-timeout", "distperf_timeout", "str", HELP_TIMEOUT),
    ("--distperf-json", "distperf_json", "str", HELP_JSON),
    ("--distperf-trace", "distperf_trace", "str", HELP_TRACE),
    ("--distperf-strict", "distperf_strict", "flag", HELP_STRICT),
    ("--distperf-same-ranks", "distperf_same_ranks", "flag", HELP_SAME_RANKS),
    ("--distperf-bind", "distperf_bind", "flag", HELP_BIND),
    ("--distperf-save-measurements", "distperf_save_measurements", "str",
     HELP_SAVE_MEASUREMENTS),
    ("--distperf-tolerance", "distperf_tolerance", "str", HELP_TOLERANCE),
    ("--distperf-exact-tolerance", "distperf_exact_tolerance", "str", HELP_EXACT_TOLERANCE),
)
# the outputs besides --distperf-json: (flag, ini name, help); paths, resolved like --junitxml
_OUTPUT_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--distperf-markdown", "distperf_markdown", HELP_MARKDOWN),
    ("--distperf-plots", "distperf_plots", HELP_PLOTS),
)
OUTPUTS_KEY = pytest.StashKey[Outputs]()
ENVIRONMENTS_KEY = pytest.StashKey[dict[str, Environment]]()


class DistperfHooks:
    """The hooks the plugin calls, for a conftest or another plugin to implement."""

    def pytest_distperf_report_sections(self, config: pytest.Config) -> dict[str, Any]:
        """Named sections to add to the ``--distperf-json`` report (under ``sections``),
        each a JSON-ready dict; the runner check (``--pyargs pytest_distperf.doctor``) adds
        ``runner_check``."""
        return {}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(DistperfHooks)


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
    for flag, ini, help_text in _OUTPUT_OPTIONS:
        group.addoption(flag, action="store", default=None, dest=ini,
                        metavar="DIR" if ini == "distperf_plots" else "PATH", help=help_text)
        parser.addini(ini, help_text, type="string", default="")
    group.addoption("--distperf-export", action="append", nargs=2, default=None,
                    dest="distperf_export", metavar=("FORMAT", "PATH"), help=HELP_EXPORT)
    parser.addini("distperf_export", "'FORMAT PATH' lines: " + HELP_EXPORT, type="linelist",
                  default=[])
    for name, default in DEFAULT_THRESHOLDS.items():
        parser.addini(f"distperf_{name}", f"the {name} threshold (default "
                      f"{'off' if default == float('inf') else f'{default:g}'})",
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
            values[ini] = parse_tolerance(value, flag, source)
        elif ini == "distperf_exact_tolerance":
            values[ini] = parse_fraction(value, flag, source)
        elif ini == "distperf_save_measurements":
            values[ini] = parse_save_measurements(value, source)
        elif ini == "distperf_env_name":
            values[ini] = parse_env_name(value, source)
        else:
            # outputs (the JSON report, the trace folder) like --junitxml; the baselines
            # folder, which lives in the repository, always from the rootdir
            values[ini] = _path(config, value, flag, source, output=ini != "distperf_baselines")
    return DistperfConfig(
        enabled=values.get("distperf", False),
        gpus=values.get("distperf_gpus"),
        backend=values.get("distperf_backend", "auto"),
        save=values.get("distperf_save", False),
        baselines_dir=values.get("distperf_baselines",
                                 Path(config.rootpath, DEFAULT_BASELINES_DIRNAME)),
        timeout_s=values.get("distperf_timeout", DEFAULT_TIMEOUT_S),
        json_path=values.get("distperf_json"),
        trace_dir=values.get("distperf_trace"),
        strict=values.get("distperf_strict", False),
        same_ranks=values.get("distperf_same_ranks", False),
        bind_ranks=values.get("distperf_bind", False),
        tolerance=values.get("distperf_tolerance", DEFAULT_TOLERANCE),
        exact_tolerance=values.get("distperf_exact_tolerance", DEFAULT_EXACT_TOLERANCE),
        save_measurements=values.get("distperf_save_measurements",
                                     DEFAULT_SAVE_MEASUREMENTS),
        env_name=values.get("distperf_env_name", ""),
    )


def _path(config: pytest.Config, value: object, flag: str, source: str, *,
          output: bool) -> Path:
    """A path option's value as an absolute path (ConfigError for an empty one, or a ``~user``
    that names no user).  Like ``--junitxml``, an output file named on the command line is
    relative to where pytest was started; anything else, and any path in the ini file, to
    the rootdir."""
    path = parse_path(value, flag, source)
    base = (config.invocation_params.dir
            if output and source.endswith("on the command line") else config.rootpath)
    return path if path.is_absolute() else Path(base, path)


def build_outputs(config: pytest.Config, cfg: DistperfConfig) -> Outputs:
    """The files to write at the end of the run; ConfigError naming the option and its
    source for a bad value."""
    from pytest_distperf.report.export import parse_format

    paths: dict[str, Path] = {}
    for flag, ini, _ in _OUTPUT_OPTIONS:
        value, source = _value(config, flag, ini)
        if value is not None:
            paths[ini] = _path(config, value, flag, source, output=True)
    cli = config.getoption("distperf_export")
    if cli:
        entries = [(fmt, path, "--distperf-export on the command line") for fmt, path in cli]
    else:
        source = f"distperf_export in {config.inipath or 'the ini file'}"
        entries = []
        for line in config.getini("distperf_export"):
            parts = str(line).split(None, 1)
            if len(parts) != 2:
                raise ConfigError(f"--distperf-export: expected 'FORMAT PATH', got {line!r} "
                                  f"(from {source})")
            entries.append((parts[0], parts[1], source))
    exports = tuple((parse_format(fmt, source),
                     _path(config, path, "--distperf-export", source, output=True))
                    for fmt, path, source in entries)
    summary = os.environ.get("GITHUB_STEP_SUMMARY", "").strip()
    return Outputs(json_path=cfg.json_path, markdown_path=paths.get("distperf_markdown"),
                   plots_dir=paths.get("distperf_plots"), exports=exports,
                   step_summary=Path(summary) if summary else None, trace_dir=cfg.trace_dir)


def get_session(config: pytest.Config) -> DistperfSession:
    return config.stash[SESSION_KEY]


# -- hooks ----------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "distperf(world_size=None, max_comm_overhead=None, max_imbalance=None, "
        "min_scaling_efficiency=None, max_arrival_skew=None, min_pipeline_utilisation=None, "
        "max_tp_comm_share=None, tolerance=None, "
        "exact_tolerance=None): a distributed "
        "performance test; overrides the group size and thresholds for this test",
    )
    try:
        cfg = build_config(config)
        thresholds = ini_thresholds(config)
        outputs = build_outputs(config, cfg)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    if cfg.enabled and outputs.plots_dir is not None:
        from pytest_distperf.report.plots import PlotError, require_matplotlib

        try:
            require_matplotlib()
        except PlotError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.stash[OUTPUTS_KEY] = outputs
    config.stash[ENVIRONMENTS_KEY] = {}
    session = DistperfSession(cfg, config, thresholds)
    config.stash[SESSION_KEY] = session
    if cfg.enabled:
        session.resolve()


def pytest_report_header(config: pytest.Config) -> str | list[str]:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.cfg.enabled:
        return "distperf: disabled (distributed performance tests are skipped; use --distperf)"
    return [session.header(), DOCS_LINE]


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
        message = str(exc)
    else:
        return
    pytest.fail(message, pytrace=False)  # outside the except: said once, with no chain


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session = item.config.stash.get(SESSION_KEY, None)
    start = None
    if session is not None and session.cfg.enabled and is_distperf_test(item):
        start = session.noise_snapshot()
    from pytest_distperf.report.terminal import junit_properties

    try:
        result = yield
    except BaseException:
        # The test raised: nothing is judged, but the figures it recorded before that still
        # go to the JUnit XML.
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and record.metrics:
            item.user_properties.extend(junit_properties(record))
        raise
    record = item.stash.get(RECORD_KEY, None)
    if session is not None and record is not None and record.metrics:
        figures = session.noise_since(start) if start is not None else None
        failure = session.judge(item, record, figures)
        item.user_properties.extend(junit_properties(record))
        limits = item.stash.get(LIMITS_KEY, None)
        if limits is not None:
            env = limits.environment
            item.config.stash[ENVIRONMENTS_KEY].setdefault(env.key(), env)
        if failure:
            pytest.fail(failure, pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if (session is None or not session.cfg.enabled or not session.is_reporter
            or session.is_xdist_worker):
        return
    from pytest_distperf.report import terminal as report
    from pytest_distperf.report.outputs import write_outputs

    records = session.records + _records_from_xdist_workers(config)
    quiet = config.get_verbosity() < 0
    if records:
        tables = [] if quiet else report.collective_lines(records)
        if tables:
            terminalreporter.write_sep("=", "distperf collectives (nccl-tests style)")
            for text in tables:
                terminalreporter.write_line(text)
        terminalreporter.write_sep("=", "distperf summary")
        for line in report.summary(records, quiet=quiet, strict=session.cfg.strict):
            terminalreporter.write_line(line.text, **line.markup)
    environments: dict[str, Environment] = {}
    for key in (ENVIRONMENTS_KEY, _XDIST_ENVIRONMENTS):
        found: dict[str, Environment] = config.stash.get(key, {})
        environments.update(found)
    sections: dict[str, Any] = {}
    for found in config.hook.pytest_distperf_report_sections(config=config):
        sections.update(found or {})
    for message in write_outputs(config.stash[OUTPUTS_KEY], records, header=session.header(),
                                 environments=list(environments.values()),
                                 start_dir=config.invocation_params.dir, sections=sections):
        terminalreporter.write_line(message.text, red=message.error)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """After a module's last test, write what the session saved into its baseline file."""
    result = yield
    if failure := get_session(item.config).write_saves(nextitem):
        pytest.fail(failure, pytrace=False)
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    # xdist sends a worker's workeroutput right after this hook (its own sessionfinish
    # wrapper), before pytest_unconfigure: the records must be there by now.
    dp = get_session(session.config)
    dp.session_end(session, dp.records + _records_from_xdist_workers(session.config))
    if dp.is_xdist_worker:
        output = session.config.workeroutput  # type: ignore[attr-defined]
        output["distperf_records"] = [record_to_dict(r) for r in dp.records]
        output["distperf_environments"] = [
            to_dict(e) for e in session.config.stash.get(ENVIRONMENTS_KEY, {}).values()]


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    session.close()


# -- pytest-xdist: workers send their records to the controller for the summary ------------
_XDIST_RECORDS = pytest.StashKey[list[TestRecord]]()
_XDIST_ENVIRONMENTS = pytest.StashKey[dict[str, Environment]]()


def _records_from_xdist_workers(config: pytest.Config) -> list[TestRecord]:
    return config.stash.get(_XDIST_RECORDS, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {}) or {}
    records = [record_from_dict(r) for r in output.get("distperf_records", [])]
    config = node.config
    config.stash[_XDIST_RECORDS] = config.stash.get(_XDIST_RECORDS, []) + records
    environments = config.stash.setdefault(_XDIST_ENVIRONMENTS, {})
    for data in output.get("distperf_environments", []):
        env = from_dict(Environment, data)
        environments.setdefault(env.key(), env)


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture
def nccl_group(request: pytest.FixtureRequest) -> Any:
    """A live process group of ``--gpus`` ranks (or the marker's ``world_size``), kept for the
    session: ``run(fn, *args, **kwargs)`` on every rank, ``bench(op, sizes)``."""
    return make_group(request)[0]


@pytest.fixture
def ddp_step_timer(request: pytest.FixtureRequest) -> Any:
    """Time DDP/FSDP2 training steps on the group: ``ddp_step_timer(model_fn, batch_fn,
    steps=20, warmup=3, world_size=None, loss_fn=None, wrapper="ddp") -> StepTiming`` and
    ``ddp_step_timer.scaling(model_fn, batch_fn, world_sizes=(1, 2, 4), mode="weak")``."""
    from pytest_distperf.fixtures.steptimer import DDPStepTimer

    group, limits = make_group(request)
    return DDPStepTimer(group, limits.thresholds)


@pytest.fixture
def dist_profiler(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Profile a function on every rank: ``dist_profiler(fn, *args, world_size=None,
    **kwargs) -> ProfileReport``; the ranks' traces are merged into one Chrome/Perfetto file
    in ``--distperf-trace DIR`` (default: the test's ``tmp_path``)."""
    from pytest_distperf.fixtures.profiler import DistProfiler

    session = get_session(request.config)
    group, limits = make_group(request)
    return DistProfiler(group, trace_dir=session.cfg.trace_dir or tmp_path,
                        nodeid=request.node.nodeid, limits=limits.thresholds,
                        write=session.is_reporter)


def make_group(request: pytest.FixtureRequest) -> tuple[Any, TestLimits]:
    """The test's :class:`~pytest_distperf.fixtures.group.DistGroup`, recording into its record, and
    the test's limits (resolved here, once, for the fixtures' analyses and the verdict)."""
    from pytest_distperf.fixtures.group import DistGroup

    session = get_session(request.config)
    item = request.node
    try:
        size = int(marker_settings(item).get("world_size", session.world_size))
    except ConfigError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        pytest.fail(message, pytrace=False)  # outside the except: said once, with no chain
    if size > session.world_size:
        pytest.fail(
            f"@pytest.mark.distperf(world_size={size}) is larger than the {session.world_size} "
            f"ranks of this run; run with --gpus {size} or more", pytrace=False)

    def recorder(label: str, metrics: Sequence[Metric], result: Any,
                 remeasure: Remeasure | None = None, fresh_ranks: bool = False) -> None:
        session.add_measurement(item, size, Measurement(label, tuple(metrics), result,
                                                        remeasure, fresh_ranks))

    # Start the pool now, before the test body: the noise probe of the test call needs the
    # ranks' pids at its start, and a pool spawning inside a measured window is noise itself.
    session.engine.rank_info()
    limits = session.limits_for(item, size)
    group = DistGroup(session.engine, size, recorder=recorder,
                      module=getattr(request, "module", None))
    return group, limits
