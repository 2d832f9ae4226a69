"""Property-based fuzzing (hypothesis) of every input users control (issue 11).

Option and ini values, the ``distperf`` marker's keywords, sizes and baseline files
(random and mutated TOML, wrong types, deep nesting, huge numbers, NaN and inf, negative
times, binary garbage, truncated files).  Each input ends either accepted with a sane value
or in a clear error that names the input (ConfigError, ValueError from ``parse_size``,
BaselineError with the file), never another exception; and loading, judging and a failed
save change nothing on disk.

Derandomized, so CI sees the same examples on every run; ``DISTPERF_FUZZ_SCALE=20`` runs
twenty times as many (derandomized as well).  Pure, except the end-to-end checks at the
bottom, which run pytest in-process through pytester (no ranks are started).  Those runs are
given every output option and a baseline file as well: a refused run leaves the folder as it
was (the same files and folders, the same SHA-256), and a run that goes ahead writes whole
reports and leaves the baseline file as it was.
"""

from __future__ import annotations

import decimal
import fractions
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import tomli_w
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_baseline import CPU, CPU4, QUIET, TIMES, save, stored

from pytest_distperf import verdict as bl
from pytest_distperf.config import (
    BACKENDS,
    MARKER_KEYWORDS,
    MAX_SIZE_BYTES,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
    MIN_TIMEOUT_S,
    ConfigError,
    format_size,
    is_int,
    parse_backend,
    parse_bool,
    parse_fraction,
    parse_gpus,
    parse_path,
    parse_size,
    parse_timeout,
    parse_tolerance,
    validate_marker_kwargs,
)
from pytest_distperf.fixtures.collectives import resolve_sizes
from pytest_distperf.records import METRIC_KINDS, VERDICT_ORDER, Measurement, Metric
from pytest_distperf.report import terminal as report
from pytest_distperf.verdict.judgement import make_judgement, settle
from pytest_distperf.verdict.store import TIME_UNITS

SCALE = int(os.environ.get("DISTPERF_FUZZ_SCALE", "1"))
settings.register_profile(
    "distperf-fuzz", deadline=None, derandomize=True, database=None, print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])


def fuzz(examples: int, *allow: HealthCheck) -> settings:
    """The fuzz profile with ``examples`` examples (times ``DISTPERF_FUZZ_SCALE``), and the
    health checks ``allow`` suppressed as well."""
    profile = settings.get_profile("distperf-fuzz")
    return settings(profile, max_examples=examples * SCALE,
                    suppress_health_check=[*profile.suppress_health_check, *allow])


SOURCE = "the fuzzer"
#: Text without lone surrogates (what a file, an argv or an ini value can hold).
TEXT = st.text(st.characters(codec="utf-8"), max_size=24)
HUGE_INTS = st.sampled_from([2**63, 10**309, -(10**309), 10**400, 10**4000])
NUMBERS = st.one_of(st.floats(), st.integers(), HUGE_INTS)
#: What someone can type for an option: numbers as text in every spelling, huge ones, words.
TYPED = st.one_of(
    TEXT,
    st.from_regex(r"\A\s{0,2}[+-]?(\d{0,6}(\.\d{0,6})?|inf|nan|Infinity|NaN|1_000)"
                  r"([eE][+-]?\d{1,4})?\s{0,2}\Z"),
    st.floats().map(repr), st.integers().map(str), HUGE_INTS.map(str),
    st.integers(300, 6000).map(lambda n: "9" * n),
    st.sampled_from(["1", "2", "0.1", "10", "1e-9", "1e300", "0x10", "\u0663", "\uff12",
                     " 4 ", "-0", "true", "off", "NCCL", " gloo\t"]))
#: What a marker keyword can be: anything Python has.
OBJECTS = st.one_of(
    st.none(), st.booleans(), NUMBERS, TYPED, st.decimals(), st.fractions(),
    st.complex_numbers(), st.lists(st.integers(), max_size=2),
    st.sampled_from([fractions.Fraction(10**400, 3), decimal.Decimal("1e999999"),
                     decimal.Decimal("sNaN"), object(), b"0.1", {"a": 1}]))


def one_clear_line(exc: BaseException, *names: str) -> str:
    """The error's message, after checking that it names every one of ``names``, is one line
    and stays short even for a huge value."""
    message = str(exc)
    for name in names:
        assert name in message, (name, message)
    assert "\n" not in message, message
    assert len(message) < 600, message
    return message


# -- option and ini values ----------------------------------------------------------------
ANYTHING = st.one_of(TYPED, OBJECTS)
T = TypeVar("T")


def parsed(parse: Callable[[], T], *names: str) -> T | None:
    """What ``parse()`` returns; or None, after checking that its ConfigError is one clear
    line naming ``names`` and where the value came from."""
    try:
        return parse()
    except ConfigError as exc:
        one_clear_line(exc, *names, f"(from {SOURCE})")
        return None


@fuzz(400)
@given(ANYTHING)
def test_gpus_is_a_sane_world_size_or_a_clear_error(value: object) -> None:
    n = parsed(lambda: parse_gpus(value, SOURCE), "--gpus")
    if n is not None:
        assert is_int(n) and 1 <= n <= MAX_WORLD_SIZE and n == int(str(value).strip())


@fuzz(200)
@given(ANYTHING)
def test_backend_is_one_of_the_backends_or_a_clear_error(value: object) -> None:
    backend = parsed(lambda: parse_backend(value, SOURCE), "--distperf-backend",
                     ", ".join(BACKENDS))
    if backend is not None:
        assert backend in BACKENDS and backend == str(value).strip().lower()


@fuzz(400)
@given(ANYTHING)
def test_timeout_is_a_sane_number_of_seconds_or_a_clear_error(value: object) -> None:
    seconds = parsed(lambda: parse_timeout(value, SOURCE), "--distperf-timeout")
    if seconds is not None:
        assert isinstance(seconds, float) and MIN_TIMEOUT_S <= seconds <= MAX_TIMEOUT_S


@fuzz(200)
@given(ANYTHING)
def test_flags_are_true_or_false_or_a_clear_error(value: object) -> None:
    flag = parsed(lambda: parse_bool(value, "--distperf-save", SOURCE), "--distperf-save",
                  "true or false")
    if flag is not None:  # accepted: it means what it says
        truthy = value if isinstance(value, bool) else (
            str(value).strip().lower() in ("1", "true", "yes", "on"))
        assert flag is truthy


@fuzz(200)
@given(st.one_of(TYPED, TEXT.map(lambda t: "~" + t), st.just("~nosuchuser/x.json")))
def test_paths_are_paths_or_a_clear_error(value: str) -> None:
    path = parsed(lambda: parse_path(value, "--distperf-json", SOURCE), "--distperf-json")
    if path is not None:
        assert isinstance(path, Path) and str(path).strip() and "\0" not in str(path)


@fuzz(500)
@given(ANYTHING, st.sampled_from(["tolerance", "fraction"]))
def test_thresholds_and_tolerances_are_sane_fractions_or_a_clear_error(
        value: object, kind: str) -> None:
    name = "distperf_max_imbalance" if kind == "fraction" else "--distperf-tolerance"
    parser = parse_fraction if kind == "fraction" else parse_tolerance
    number = parsed(lambda: parser(value, name, SOURCE), name)
    if number is not None:
        assert isinstance(number, float) and math.isfinite(number) and number >= 0
        assert kind == "fraction" or number <= 1


# -- the marker ------------------------------------------------------------------------------
MARKER_KWARGS = st.dictionaries(
    st.one_of(st.sampled_from(MARKER_KEYWORDS), TEXT.filter(str.isidentifier)),
    st.one_of(OBJECTS, st.integers(-3, 9), st.floats(0, 2)), max_size=4)


@fuzz(500)
@given(MARKER_KWARGS)
def test_marker_keywords_are_sane_or_a_clear_error(kwargs: dict[str, object]) -> None:
    where = "tests/test_x.py::test_y"
    try:
        out = validate_marker_kwargs(kwargs, where)
    except ConfigError as exc:
        message = one_clear_line(exc, f"@pytest.mark.distperf on {where}")
        assert any(key in message for key in kwargs), message  # names the keyword
        return
    assert set(out) == {k for k, v in kwargs.items() if v is not None}
    for key, value in out.items():
        if key == "world_size":
            assert is_int(value) and value >= 1
        else:
            assert isinstance(value, float) and math.isfinite(value) and value >= 0
            assert key != "tolerance" or value <= 1


# -- sizes -----------------------------------------------------------------------------------
UNITS = (("", 1), ("B", 1), ("K", 1024), ("KB", 1024), ("KiB", 1024), ("Ki", 1024),
         ("M", 1024**2), ("MB", 1024**2), ("MiB", 1024**2), ("G", 1024**3), ("GiB", 1024**3),
         ("T", 1024**4), ("TiB", 1024**4))


@st.composite
def size_strings(draw: st.DrawFn) -> tuple[str, int | None]:
    """A size as a person would write it, and the byte count it means (None: not whole)."""
    whole = draw(st.one_of(st.integers(0, 10**6).map(str), st.integers(0, 10**30).map(str),
                           st.integers(1, 5000).map(lambda n: "9" * n)))
    frac = draw(st.one_of(st.just(""), st.from_regex(r"\A\.[0-9]{1,8}\Z")))
    unit, factor = draw(st.sampled_from(UNITS))
    unit = "".join(c.swapcase() if draw(st.booleans()) else c for c in unit)
    space = draw(st.sampled_from(["", " ", "  "]))
    if len(whole) > 40:  # far beyond any byte count: must be refused
        return f"{whole}{frac}{space}{unit}", MAX_SIZE_BYTES + 1
    exact = fractions.Fraction(whole + frac) * factor
    return f"{whole}{frac}{space}{unit}", int(exact) if exact.denominator == 1 else None


@fuzz(400)
@given(st.one_of(size_strings(), TYPED.map(lambda t: (t, None)),
                 OBJECTS.map(lambda o: (o, None))))
def test_sizes_are_exact_byte_counts_or_a_clear_error(case: tuple[object, int | None]) -> None:
    value, meant = case
    try:
        nbytes = parse_size(value)
    except ValueError as exc:
        assert type(exc) is ValueError  # not a subclass from deep inside (OverflowError is not one)
        one_clear_line(exc, "size")
        assert meant is None or meant > MAX_SIZE_BYTES, (value, meant)
    else:
        assert is_int(nbytes) and 0 <= nbytes <= MAX_SIZE_BYTES
        if meant is not None:
            assert nbytes == meant, (value, nbytes, meant)
        if is_int(value):
            assert nbytes == value


@fuzz(200)
@given(st.integers(0, MAX_SIZE_BYTES))
def test_format_size_round_trips(nbytes: int) -> None:
    assert parse_size(format_size(nbytes)) == nbytes


SIZE_ITEMS = st.one_of(size_strings().map(lambda case: case[0]), st.integers(-2, 2**40),
                       OBJECTS)


@fuzz(200)
@given(st.one_of(SIZE_ITEMS, st.lists(SIZE_ITEMS, max_size=4),
                 st.lists(SIZE_ITEMS, max_size=4).map(tuple), st.sets(st.integers(1, 99)),
                 st.just(range(1, 5)), st.builds(iter, st.lists(st.integers(1, 9)))))
def test_bench_sizes_are_sorted_byte_counts_or_a_clear_error(sizes: Any) -> None:
    """What ``nccl_group.bench(op, sizes)`` makes of ``sizes`` before any rank runs."""
    try:
        resolved = resolve_sizes(sizes, "cpu")
    except ValueError as exc:
        assert type(exc) is ValueError
        one_clear_line(exc, "size")
        return
    counts = [n for _, n in resolved]
    assert counts and counts == sorted(set(counts)) and counts[0] >= 1
    assert all(parse_size(label) == n for label, n in resolved)


# -- baseline files --------------------------------------------------------------------------
ENV_ID = bl.environment_id(CPU)
#: Values TOML can hold, of every type, nested a little.
TOML_LEAVES = st.one_of(
    st.booleans(), st.integers(-(2**70), 2**70), st.floats(), TEXT, HUGE_INTS, st.dates(),
    st.datetimes(), st.times())
TOML_VALUES = st.recursive(
    TOML_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                          st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6)
#: Figures a baseline can hold: ordinary ones, and the extremes of what is valid.
FIGURE = st.one_of(st.floats(0, 1e3), st.sampled_from([0.0, 5e-324, 1e-300, 1e300, 1.7e308]),
                   st.integers(0, 2**63))
# Strategies are built once, here: hypothesis validates a strategy each time one is made.
UNIT = st.one_of(st.sampled_from([*TIME_UNITS, "GB/s", "fraction", "calls", "B"]), TEXT)
SAMPLES = st.lists(FIGURE, max_size=6)
CONTROLS = [st.lists(st.floats(1e-4, 1e-2), min_size=n, max_size=n) for n in range(7)]
LIMITS = st.dictionaries(st.sampled_from(bl.store.THRESHOLD_KEYS), st.floats(0, 1),
                         max_size=3)
TEST_NAMES = st.lists(st.one_of(st.sampled_from(["test_a", "test_b"]), TEXT), min_size=1,
                      max_size=3, unique=True)
METRIC_NAMES = st.lists(st.sampled_from(["w.time_s", "comm_overhead", "x.calls"]),
                        min_size=1, max_size=3, unique=True)
ENV_KEYS = {n: st.sampled_from([ENV_ID, bl.environment_id(CPU4)][:n]) for n in (1, 2)}


@st.composite
def metric_tables(draw: st.DrawFn) -> dict[str, Any]:
    samples = draw(SAMPLES)
    table: dict[str, Any] = {"unit": draw(UNIT), "higher_is_better": draw(st.booleans()),
                             "value": draw(FIGURE), "samples": samples}
    kind = draw(st.sampled_from(METRIC_KINDS))
    if kind:
        table["kind"] = kind
    if draw(st.booleans()):
        table["control"] = draw(CONTROLS[len(samples)])
        if draw(st.booleans()):
            table["memory_control"] = draw(CONTROLS[len(samples)])
    if len(samples) > 1 and draw(st.booleans()):
        table["measurements"] = [1] * len(samples)
    for key in ("steal", "cpu_wait", "estimate", "n", "note"):
        if draw(st.integers(0, 4)) == 0:
            table[key] = draw(FIGURE)
    return table


def environment_table(env: Any) -> dict[str, Any]:
    return {f.name: getattr(env, f.name) for f in env.__dataclass_fields__.values()}


@st.composite
def baseline_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A baseline file's data: the real layout with random values, most of them sane."""
    envs: dict[str, Any] = {ENV_ID: environment_table(CPU)}
    if draw(st.booleans()):
        envs[ENV_ID]["thresholds"] = draw(LIMITS)
    if draw(st.booleans()):
        envs[bl.environment_id(CPU4)] = environment_table(CPU4)
    tests = {}
    for test in draw(TEST_NAMES):
        tests[test] = {draw(ENV_KEYS[len(envs)]): {
            "saved": "2025-01-02T03:04:05Z",
            "metrics": {name: draw(metric_tables()) for name in draw(METRIC_NAMES)}}}
    doc: dict[str, Any] = {"schema_version": 1, "module": "tests/test_x.py",
                           "environments": envs, "tests": tests}
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # break it somewhere
        mutate(draw, doc)
    return doc


def mutate(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """Replace or delete one value anywhere in ``doc``."""
    places: list[tuple[dict[str, Any] | list[Any], Any]] = []
    stack: list[Any] = [doc]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node))
        for key in keys:
            places.append((node, key))
            if isinstance(node[key], (dict, list)):
                stack.append(node[key])
    if not places:
        return
    node, key = draw(st.sampled_from(places))
    if draw(st.booleans()):
        node[key] = draw(TOML_VALUES)
    else:
        del node[key]


#: Lines a hand edit or a merge can leave in a file, that no TOML writer produces.
NASTY_LINES = st.one_of(st.sampled_from([
    "value = 1" + "0" * 400, "value = 1" + "0" * 5000, "value = -1e999", "value = nan",
    "samples = [1.0, \"2\"]", "samples = [1e308, 1e308, -1e308]", "measurements = [true]",
    "x = " + "[" * 3000 + "]" * 3000, "x = " + "{a = " * 300 + "1" + "}" * 300,
    "x." + "a." * 3000 + "b = 1", "[" + "a." * 3000 + "b]", "<<<<<<< HEAD", "=======",
    "[tests.test_a]", "schema_version = 2", "unit = 1", "\x00", "value = 1979-05-27",
    "value = 0x7fffffffffffffffffff", "value = inf", "control = [-1.0]",
]), TEXT)


@st.composite
def baseline_bytes(draw: st.DrawFn) -> bytes:
    """A baseline file's bytes: a written document, then perhaps hand-edited, truncated,
    spliced with garbage; or garbage alone."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    text = tomli_w.dumps(draw(baseline_documents()))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        lines = text.splitlines(keepends=True)
        at = draw(st.integers(0, len(lines)))
        edit = draw(st.sampled_from(["insert", "delete", "truncate", "garbage"]))
        if edit == "insert":
            lines.insert(at, draw(NASTY_LINES) + "\n")
        elif edit == "delete" and at < len(lines):
            del lines[at]
        text = "".join(lines)
        if edit == "truncate":
            text = text[:draw(st.integers(0, len(text)))]
        elif edit == "garbage":
            cut = draw(st.integers(0, len(text)))
            return (text[:cut].encode() + draw(st.binary(min_size=1, max_size=8))
                    + text[cut:].encode())
    return text.encode()


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder``, by name, with the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@contextmanager
def baseline_folder(raw: bytes) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tests" / "test_x.toml"
        path.parent.mkdir()
        path.write_bytes(raw)
        yield path


def load_or_refuse(path: Path) -> bl.BaselineFile | None:
    """The file, checked sane, or None after checking that the error is a clear one."""
    try:
        file = bl.load(path)
    except bl.BaselineError as exc:
        message = one_clear_line(exc, f"distperf: bad baseline file {path}")
        assert exc.path == path and (exc.line is None or exc.line >= 1), message
        assert re.search(r"left unchanged", message), message
        event("refused")
        return None
    assert file is not None
    check_sane(file)
    event("loaded")
    return file


def check_sane(file: bl.BaselineFile) -> None:
    """What a loaded file gives its users is what the format promises."""
    for env_id in file.environments():
        for key, value in file.thresholds(env_id).items():
            assert key in bl.store.THRESHOLD_KEYS and math.isfinite(value) and value >= 0
            assert key != "tolerance" or value <= 1
    for test in file.data.get("tests", {}):
        for env_id in file.test_environments(test):
            assert env_id in file.environments()
            for metric in (file.metrics(test, env_id) or {}).values():
                samples = metric.samples
                numbers = (metric.value, *samples.values, *samples.control)
                assert all(isinstance(v, float) and math.isfinite(v) for v in numbers)
                assert metric.unit not in TIME_UNITS or min(numbers) >= 0
                assert all(c > 0 for c in samples.control)
                assert not samples.sizes or sum(samples.sizes) == len(samples.values)
                assert metric.kind in METRIC_KINDS and isinstance(metric.higher_is_better,
                                                                  bool)


def judge(file: bl.BaselineFile, test: str, factor: float, save_it: bool) -> Any:
    """Judge (or save) fresh metrics of the names the file stores for ``test``, through the
    whole re-measure loop; the judgement."""
    names = {name: m for env_id in file.test_environments(test)
             for name, m in (file.metrics(test, env_id) or {}).items()}
    metrics = [Metric(name, m.value * factor, m.unit, m.higher_is_better,
                      tuple(v * factor for v in (m.samples.values or TIMES)), kind=m.kind,
                      control=((0.0025,) * len(m.samples.values or TIMES)
                               if m.samples.control else ()))
               for name, m in names.items()]
    metrics.append(Metric("new.time_s", 0.02, "s", False, TIMES))
    judgement = make_judgement(
        save=save_it, measurements=[Measurement("m", tuple(metrics), None, lambda: metrics)],
        environment=CPU, first_noise=QUIET, tolerance=0.10, baseline=file, test=test)
    settle(judgement, lambda label: (metrics, QUIET), sleep=lambda seconds: None)
    verdicts = judgement.verdicts()
    assert {v.metric for v in verdicts} == {m.name for m in metrics}
    assert all(v.verdict in VERDICT_ORDER for v in verdicts)
    assert report.verdict_report(verdicts, f"tests/test_x.py::{test}", file.path)
    return judgement


@fuzz(250)
@given(baseline_bytes(), st.sampled_from([0.5, 1.0, 3.0]))
def test_baseline_files_load_judge_and_save_or_fail_clearly_and_change_nothing(
        raw: bytes, factor: float) -> None:
    with baseline_folder(raw) as path:
        before = digest(path.parent)
        file = load_or_refuse(path)
        if file is not None:
            for test in file.data.get("tests", {}):
                judge(file, test, factor, save_it=False)
        assert digest(path.parent) == before  # loading and judging never write
        try:
            save(path, "test_a", CPU, **{"w.time_s": stored()})
        except bl.BaselineError as exc:
            assert file is None, exc  # only a file that cannot be read is refused
            one_clear_line(exc, str(path))
            assert digest(path.parent) == before
            return
        assert file is not None, "a file that could not be read was written over"
        again = load_or_refuse(path)
        assert again is not None
        # the other tests are kept as the current layout keeps them (version 2: rounded)
        written = bl.BaselineFile(path, {"schema_version": bl.SCHEMA_VERSION, "tests": {
            t: {e: file.entry_v2(t, e) for e in file.test_environments(t)}
            for t in file.data.get("tests", {})}})
        kept = {t: {e: written.metrics(t, e) for e in file.test_environments(t)}
                for t in file.data.get("tests", {}) if t != "test_a"}
        assert kept == {t: {e: again.metrics(t, e) for e in again.test_environments(t)}
                        for t in again.data.get("tests", {}) if t != "test_a"}
        assert again.environments().get(ENV_ID, {}).get("thresholds") == (
            file.environments().get(ENV_ID, {}).get("thresholds"))


@fuzz(60)
@given(baseline_documents(), st.sampled_from([0.5, 1.0, 2.0]))
def test_saving_a_judgement_over_a_good_file_keeps_it_good(
        doc: dict[str, Any], factor: float) -> None:
    with baseline_folder(tomli_w.dumps(doc).encode()) as path:
        file = load_or_refuse(path)
        if file is None or not file.data.get("tests"):
            return
        test = sorted(file.data["tests"])[0]
        judgement = judge(file, test, factor, save_it=True)
        bl.save_test(path, "tests/test_x.py", test, judgement.save_entries())
        again = load_or_refuse(path)
        assert again is not None and again.metrics(test, ENV_ID)


@fuzz(120)
@given(st.one_of(st.sampled_from([1, 7, 31, 32, 33, 200, 500, 1000, 3000, 6000]),
                 st.integers(1, 6000)),
       st.sampled_from(["array", "inline", "dotted", "header"]),
       st.sampled_from(["top", "metric", "samples"]))
def test_deep_nesting_is_read_and_saved_or_refused_clearly(
        depth: int, shape: str, where: str) -> None:
    nested = {"array": "[" * depth + "]" * depth,
              "inline": "{a = " * depth + "1" + "}" * depth}
    metric = (f'[tests.test_b."{ENV_ID}".metrics."w.time_s"]\nunit = "s"\n'
              "higher_is_better = false\nvalue = 1.0\n")
    if shape in nested:
        line = f"{'samples' if where == 'samples' else 'x'} = {nested[shape]}\n"
    elif shape == "dotted":
        line = "x." + "a." * depth + "b = 1\n"
    else:
        line = "[x." + "a." * depth + "b]\nc = 1\n"
        where = "top"  # a header ends the table before it
    head = 'schema_version = 1\nmodule = "tests/test_x.py"\n'
    envs = tomli_w.dumps({"environments": {ENV_ID: environment_table(CPU)}})
    text = head + (line + envs + metric if where == "top" else envs + metric + line)
    with baseline_folder(text.encode()) as path:
        before = digest(path.parent)
        file = load_or_refuse(path)
        try:
            save(path, "test_a", CPU, **{"w.time_s": stored()})
        except bl.BaselineError:
            assert file is None and digest(path.parent) == before
        else:
            assert file is not None and load_or_refuse(path) is not None


# -- end to end: pytest itself, in-process (no ranks) -------------------------------------
FLAGS = ("--gpus", "--distperf-backend", "--distperf-timeout", "--distperf-tolerance",
         "--distperf-exact-tolerance", "--distperf-save-measurements")
#: Where each end-to-end run is told to write (before the input under test, which wins where
#: it names the same option), so that a bad input is seen to write none of it.
OUTPUTS = ("--distperf-save", "--distperf-baselines=perf_baselines",
           "--distperf-json=out/report.json", "--distperf-markdown=out/report.md",
           "--distperf-trace=out/traces")


def on_disk(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder`` with the SHA-256 of its bytes ("folder" for a
    folder), leaving out what pytest and other plugins write (``__pycache__``,
    ``.pytest_cache``, pytest-benchmark's ``.benchmarks``)."""
    return {str(p.relative_to(folder)): "folder" if p.is_dir() else
            hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if not {"__pycache__", ".pytest_cache", ".benchmarks"} & set(
                p.relative_to(folder).parts)}


def with_a_baseline(pytester: pytest.Pytester, module: str) -> None:
    """A baseline file for ``module`` in ``perf_baselines``, as a saved run leaves it."""
    save(pytester.path / "perf_baselines" / f"{module}.toml", "test_x", CPU,
         **{"w.time_s": stored()})


def outputs_complete(folder: Path) -> None:
    """The outputs a run wrote are whole: the JSON report parses, the Markdown report ends
    with a newline (no partial files)."""
    for path in folder.rglob("*"):
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".md":
            assert path.read_text().endswith("\n"), path


def no_traceback(result: pytest.RunResult) -> str:
    """Everything pytest printed, after checking that none of it is a Python traceback."""
    text = "\n".join(result.outlines + result.errlines)
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    return text


@pytest.mark.parametrize(("args", "ini", "words"), [
    (["--gpus", "0"], "", "--gpus: the world size must be at least 1, got 0"),
    (["--gpus", "9" * 5000], "", "--gpus: expected a whole number of ranks >= 1, got '999"),
    (["--distperf-timeout", "1e300"], "", "--distperf-timeout: '1e300' s is longer than"),
    (["--distperf-tolerance", "10"], "", "--distperf-tolerance: the tolerance is a fraction"),
    (["--distperf-backend", "mpi"], "", "--distperf-backend: expected one of auto, nccl, gloo"),
    (["--distperf-save-measurements", "0"], "",
     "--distperf-save-measurements: expected a whole number from 1 to 50, got '0'"),
    ([], "distperf_save_measurements = 2.5",
     "--distperf-save-measurements: expected a whole number from 1 to 50, got '2.5'"),
    ([], "distperf_max_imbalance = nan", "distperf_max_imbalance: expected a finite number"),
    ([], "distperf_timeout = soon", "--distperf-timeout: expected a number of seconds, got"),
    ([], "distperf_gpus = 100000", "--gpus: 100000 ranks are more than one machine runs"),
    ([], "distperf_strict = perhaps", "--distperf-strict: expected true or false"),
    (["--distperf-json=~nosuchuser_zz/x.json"], "", "--distperf-json: cannot expand"),
    (["--distperf-baselines="], "", "--distperf-baselines: expected a path, got ''"),
    (["--distperf-markdown=~nosuchuser_zz/x.md"], "", "--distperf-markdown: cannot expand"),
])
def test_a_bad_option_or_ini_value_is_a_usage_error(
        torch_imported: None, pytester: pytest.Pytester, args: list[str], ini: str,
        words: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    with_a_baseline(pytester, "test_plain")
    before = on_disk(pytester.path)
    result = pytester.runpytest("--distperf", *OUTPUTS, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = no_traceback(result)
    assert f"ERROR: {words}" in text, text
    assert len(text) < 1000, text  # one line, however long the value
    assert on_disk(pytester.path) == before  # no output, not even a folder; the baseline kept


@fuzz(25, HealthCheck.function_scoped_fixture)  # pytester's folder: rewritten each time
@given(st.sampled_from(FLAGS), TYPED, st.booleans())
def test_any_option_value_runs_or_is_a_usage_error(
        torch_imported: None, pytester: pytest.Pytester, flag: str, value: str,
        in_ini: bool) -> None:
    ini = f"distperf_{flag.removeprefix('--').removeprefix('distperf-').replace('-', '_')}"
    shutil.rmtree(pytester.path / "out", ignore_errors=True)  # an earlier example's outputs
    if not (pytester.path / "perf_baselines").exists():
        with_a_baseline(pytester, "test_plain")
    if in_ini:
        if value.splitlines() != [value] or not value.strip():
            return  # not a one-line ini value (iniconfig also breaks lines at \x85, \x0b, ...)
        pytester.makeini(f"[pytest]\n{ini} = {value}\n")
        args = ["--distperf", *OUTPUTS, "-p", "no:cacheprovider"]
    else:
        pytester.makeini("[pytest]\n")
        args = ["--distperf", *OUTPUTS, f"{flag}={value}", "-p", "no:cacheprovider"]
    before = on_disk(pytester.path)
    result = pytester.runpytest(*args)
    text = no_traceback(result)
    assert result.ret in (pytest.ExitCode.NO_TESTS_COLLECTED, pytest.ExitCode.USAGE_ERROR), text
    if result.ret == pytest.ExitCode.USAGE_ERROR:
        assert f"ERROR: {flag}" in text or ini in text, text
        assert on_disk(pytester.path) == before  # no output, not even a folder
    else:  # nothing measured: the baseline stays as it was; the reports are whole
        after = on_disk(pytester.path)
        assert {k: v for k, v in after.items() if not k.startswith("out")} == before
        outputs_complete(pytester.path / "out")


@pytest.fixture(scope="session")
def torch_imported() -> None:
    """torch, imported before pytester's snapshot of the loaded modules: ``--distperf``
    imports it, pytester would unload an import made during a test, and torch cannot be
    imported twice in one process."""
    pytest.importorskip("torch")


MARKED = """
import pytest

@pytest.mark.distperf({kwargs})
def test_marked():
    pass
"""


@pytest.mark.parametrize(("kwargs", "words"), [
    ("max_imbalance=10**400", "max_imbalance: expected a finite number >= 0, got 1000"),
    ("tolerance=15", "tolerance: the tolerance is a fraction (0.10 means 10%), got 15"),
    ("world_size='2'", "world_size must be an int >= 1, got '2'"),
    ("max_imbalanse=0.2", "unknown keyword 'max_imbalanse'"),
])
def test_a_bad_marker_is_an_error_of_its_test_naming_the_keyword(
        torch_imported: None, pytester: pytest.Pytester, kwargs: str, words: str) -> None:
    pytester.makepyfile(test_marked=MARKED.format(kwargs=kwargs))
    with_a_baseline(pytester, "test_marked")
    before = on_disk(pytester.path / "perf_baselines")
    result = pytester.runpytest("--distperf", *OUTPUTS, "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # in its setup: no ranks are started
    # the session ran, so it wrote its reports, whole; the baseline file is as it was
    assert on_disk(pytester.path / "perf_baselines") == before
    outputs_complete(pytester.path / "out")
    text = no_traceback(result)
    assert "@pytest.mark.distperf on test_marked.py::test_marked" in text, text
    assert words in text, text
    # said once in the error section (it was said twice, chained); pytest's short summary
    # repeats the message, cut to the terminal's width unless $CI is set, so it is left out
    errors = text.split("short test summary info")[0]
    assert errors.count(words) == 1, text
    assert "During handling of the above exception" not in text, text
