"""Baseline files: where they are, what they hold, reading them and saving into them.  Pure.

One TOML file per test module under the baseline folder (``perf_baselines/``),
``tests/perf/test_x.py`` -> ``perf_baselines/tests/perf/test_x.toml``; its layout (version 2,
and version 1 still read) is :mod:`~pytest_distperf.verdict.storefile`'s.  A save merges the
tests of a module saved in a session into the file in one read and one write
(:func:`save_tests`): under an exclusive lock of the folder, so that pytest-xdist workers
saving at once lose nothing; through a temporary file in a git-ignored folder beside it,
renamed into place (through a symlink to the file it points to).  A file that cannot be read
is an error naming the file and the line, and is never written over.  A version-2 file is
held as the text of each entry, parsed when used: a save rebuilds what it writes anew.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from pytest_distperf.common.files import write_atomically
from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.records import SINGLE_MEASUREMENT_KINDS, Environment, Measured, Samples
from pytest_distperf.verdict.environment import (
    environment_id,
    environment_table,
    same_environment,
)
from pytest_distperf.verdict.stats import estimate
from pytest_distperf.verdict.storefile import (
    ENTRY_HEAD,
    SCHEMA_VERSION,
    THRESHOLD_KEYS,
    TIME_UNITS,
    BaselineError,
    as_written,
    entry_text,
    entry_v2,
    flat_entry,
    head_text,
    loads,
    parse,
    validate,
)

__all__ = [
    "SCHEMA_VERSION", "THRESHOLD_KEYS", "TIME_UNITS", "BaselineError", "BaselineFile",
    "SaveEntry", "SessionFiles", "StoredMetric", "baseline_path", "clean_stale_temps",
    "environment_id", "load", "same_environment", "save_test", "save_tests", "split_nodeid",
]

#: The folder, beside a baseline file, that a save writes its temporary file in: it holds a
#: ``.gitignore`` of ``*`` (as ``.pytest_cache`` does), so that a commit of the baseline
#: folder never picks up what a killed save left.
TMP_DIRNAME = ".distperf-tmp"
#: The temporary files of saves before there was a TMP_DIRNAME: ``.test_x.toml.k2j4_x.tmp``.
_OLD_TMP = re.compile(r"^\..+\.toml\.[A-Za-z0-9_]+\.tmp$")
Texts = dict[str, dict[str, str]]  # test -> environment -> the text of its entry


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``("tests/test_x.py", "TestA::test_b[1]")`` from a pytest node id."""
    module, _, test = nodeid.partition("::")
    return module, test or module


def baseline_path(root: Path, nodeid: str) -> Path:
    """The file holding the baselines of ``nodeid``'s module, under ``root``."""
    module, _ = split_nodeid(nodeid)
    parts = [("__" if p == ".." else p) for p in Path(module).parts if p not in ("/", ".")]
    relative = Path(*parts) if parts else Path("tests")
    return root / relative.with_suffix(".toml")


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMetric:
    """One metric's baseline: its unit, direction and kind, and the measurement it stores
    (several pooled, with the host-speed control); ``tolerance`` is the one in force when it
    was saved, shown to reviewers (a comparison uses the one in force then)."""

    unit: str
    higher_is_better: bool
    measured: Measured
    kind: str = ""  # the metric's kind (records.METRIC_KINDS)
    tolerance: float | None = None

    @property
    def is_fraction(self) -> bool:
        return self.unit == "fraction"

    @property
    def value(self) -> float:
        return self.measured.value

    @property
    def samples(self) -> Samples:
        return self.measured.samples

    @property
    def figure(self) -> float:
        """The figure a comparison uses (the estimator over the samples, or the value)."""
        return estimate(self.samples.values, self.value, self.higher_is_better,
                        self.is_fraction)


def stored_metric_table(metric: StoredMetric) -> dict[str, Any]:
    """The flat table of one metric (:mod:`~pytest_distperf.verdict.storefile`), unrounded,
    with the summary figures a reviewer of version 1 saw."""
    m, samples = metric.measured, metric.samples
    table: dict[str, Any] = {"unit": metric.unit, "higher_is_better": metric.higher_is_better,
                             "value": m.value, "kind": metric.kind}
    if metric.tolerance is not None:
        table["tolerance"] = metric.tolerance
    if metric.kind in SINGLE_MEASUREMENT_KINDS:
        return table
    values = samples.values
    if values:
        table.update(estimate=metric.figure, median=median_or_nan(values), min=min(values),
                     max=max(values), n=len(values))
    for key, figure in (("steal", m.steal), ("cpu_wait", m.wait),
                        ("other_load", m.other_load), ("gpu_held", m.held),
                        ("gpu_sm_clock_mhz", m.sm_clock_mhz)):
        if figure is not None:
            table[key] = figure
    table["samples"] = list(values)
    for key, series in (("control", samples.control),
                        ("memory_control", samples.memory_control)):
        if series:
            table[key] = list(series)
    if len(samples.sizes) > 1:
        table["measurements"] = list(samples.sizes)
    return table


class BaselineFile:
    """A validated baseline file (of either version): the parsed ``data``, or its head and
    the ``texts`` of its entries (:func:`read_entries`), each parsed when first used, so that
    a session holds what it uses; ``kept``: entries a save writes back as they are.
    ``signature`` tells whether the file on disk is still the one read (None: not known)."""

    __slots__ = ("_head", "_kept", "_parsed", "_texts", "path", "signature")

    def __init__(self, path: Path, data: dict[str, Any],
                 signature: tuple[int, int, int] | None = None, *, texts: Texts | None = None,
                 kept: Set[tuple[str, str]] = frozenset()) -> None:
        self.path, self.signature = path, signature
        self._head = {key: value for key, value in data.items() if key != "tests"}
        self._texts, self._kept = texts, frozenset(kept)
        self._parsed: dict[str, dict[str, Any]] = data.get("tests", {}) if texts is None else {}

    @property
    def data(self) -> dict[str, Any]:
        """The whole file as parsed data, every entry parsed (for tools and tests)."""
        return {**self._head, "tests": {test: {env_id: self._entry(test, env_id, False)
                                               for env_id in per_env}
                                        for test, per_env in self._index().items()}}

    def _index(self) -> Mapping[str, Mapping[str, Any]]:
        return self._texts if self._texts is not None else self._parsed

    def _entry(self, test: str, env_id: str, keep: bool = True) -> dict[str, Any] | None:
        """The test's parsed entry in ``env_id`` (``keep``: held for the next use)."""
        parsed = self._parsed.get(test, {}).get(env_id)
        text = (self._texts or {}).get(test, {}).get(env_id)
        if parsed is None and text is not None:
            parsed = (as_written(text) or _as_toml(self.path, text))[2]
            if keep:
                self._parsed.setdefault(test, {})[env_id] = parsed
        return parsed

    def environments(self) -> dict[str, dict[str, Any]]:
        return dict(self._head.get("environments", {}))

    def thresholds(self, env_id: str) -> dict[str, float]:
        """The environment's ``thresholds`` table (threshold overrides and ``tolerance``)."""
        table = self._head.get("environments", {}).get(env_id, {}).get("thresholds", {})
        return {k: float(v) for k, v in table.items()}

    def tests(self) -> list[str]:
        return sorted(self._index())

    def test_environments(self, test: str) -> list[str]:
        return sorted(self._index().get(test, {}))

    def metrics(self, test: str, env_id: str) -> dict[str, StoredMetric] | None:
        entry = self._entry(test, env_id)
        tables = None if entry is None else flat_entry(self._head.get("schema_version"), entry)
        return None if tables is None else {n: _stored_metric(t) for n, t in tables.items()}

    def entry_v2(self, test: str, env_id: str, keep: bool = True) -> dict[str, Any]:
        """The test's entry in ``env_id`` as version 2 writes it."""
        entry = self._entry(test, env_id, keep)
        if entry is None:
            raise KeyError((test, env_id))
        return entry_v2(str(entry.get("saved", "")),
                        flat_entry(self._head.get("schema_version"), entry))

    def entry_text(self, test: str, env_id: str) -> str:
        """The text a save writes for the test's entry in ``env_id``."""
        if self._texts is not None and (test, env_id) in self._kept:
            return self._texts[test][env_id]
        return entry_text(test, env_id, self.entry_v2(test, env_id, keep=False))


def _stored_metric(table: Mapping[str, Any]) -> StoredMetric:
    """One metric's flat table of a validated file."""
    def floats(key: str) -> tuple[float, ...]:
        return tuple(float(v) for v in table.get(key, ()))

    samples = Samples(floats("samples"), floats("control"), floats("memory_control"),
                      tuple(int(v) for v in table.get("measurements", ())))
    measured = Measured(float(table["value"]), samples, _opt_float(table.get("steal")),
                        _opt_float(table.get("cpu_wait")),
                        _opt_float(table.get("other_load")), _opt_float(table.get("gpu_held")),
                        None if (mhz := table.get("gpu_sm_clock_mhz")) is None else int(mhz))
    return StoredMetric(table["unit"], table["higher_is_better"], measured,
                        str(table.get("kind", "")), _opt_float(table.get("tolerance")))


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _signature(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def load(path: Path) -> BaselineFile | None:
    """The baseline file at ``path``; None when there is none; BaselineError when bad."""
    try:
        with open(path, "rb") as f:
            signature = _signature(os.fstat(f.fileno()))
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(path, None, f"cannot be read ({exc.strerror or exc})") from None
    file = read_entries(path, raw, signature)
    return file if file is not None else BaselineFile(path, parse(path, raw), signature)


def read_entries(path: Path, raw: bytes, signature: tuple[int, int, int] | None = None
                 ) -> BaselineFile | None:
    """A version-2 file read entry by entry (parsed whole, a file takes 4x its size in
    objects), each entry validated and kept as its text: read as a save writes it
    (:func:`~.storefile.as_written`), else as TOML.  None for any other file: :func:`parse`
    reads it, or says why it cannot."""
    texts, kept = Texts(), set[tuple[str, str]]()
    try:
        text = raw.decode("utf-8")
        starts = [m.start() for m in ENTRY_HEAD.finditer(text)]
        if not starts or '"""' in text or "'''" in text:  # a multi-line string: "[tests." in it
            return None
        head = loads(path, text[: starts[0]])
        if head.get("schema_version") != SCHEMA_VERSION or "tests" in head:
            return None
        validate(path, text[: starts[0]], head)
        for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
            body = "\n" + text[start:end].rstrip("\n") + "\n"
            written = as_written(body)
            test, env_id, entry = written or _as_toml(path, body)
            if env_id in texts.get(test, {}):  # declared twice: parse() says where
                return None
            validate(path, body, {**head, "tests": {test: {env_id: entry}}})
            texts.setdefault(test, {})[env_id] = body
            if written:
                kept.add((test, env_id))
    except (BaselineError, ValueError):  # ValueError: not UTF-8, or a chunk not one entry
        return None
    return BaselineFile(path, head, signature, texts=texts, kept=kept)


def _as_toml(path: Path, body: str) -> tuple[str, str, dict[str, Any]]:
    """The test, environment and entry of one entry's text as TOML; ValueError: not one."""
    first, _, rest = body.lstrip("\n").partition("\n")
    # every table inside the entry: no two entries of a file can clash but by name
    if any(not t.startswith(first[:-1] + ".") for t in re.findall(r"^\[.*", rest, re.M)):
        raise ValueError(first)
    ((test, per_env),) = loads(path, body)["tests"].items()
    ((env_id, entry),) = per_env.items()
    return test, env_id, entry


@dataclasses.dataclass(frozen=True, slots=True)
class SaveEntry:
    """What one test measured in one environment, to be written as its baseline there."""

    environment: Environment
    metrics: Mapping[str, StoredMetric]


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[bool]:
    """An exclusive lock on ``directory`` (flock on its descriptor: no lock files to commit);
    yields whether it is locked: where there is no ``fcntl`` (Windows), saves are not
    serialised between processes."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        yield False
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def _target(path: Path) -> Path:
    """The file a save writes: ``path``, or the file it links to (the link is kept)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _current(path: Path, known: BaselineFile | None) -> BaselineFile | None:
    """The file as it is on disk: ``known`` when nothing wrote it since it was read."""
    try:
        signature = _signature(os.stat(path))
    except FileNotFoundError:
        return None
    if known is not None and known.signature == signature:
        return known
    return load(path)


def save_tests(path: Path, module: str, saves: Sequence[tuple[str, Sequence[SaveEntry]]],
               saved_at: str | None = None, known: BaselineFile | None = None
               ) -> BaselineFile:
    """Write the baselines of several tests (test name, its entries) of one module into
    ``path`` in one read and one write; the file as written.

    ``known``: the file as read earlier in the session, used as it is when the file has not
    changed since (else it is read again).  Other tests, other environments and every
    environment's ``thresholds`` table are kept.  A file that cannot be read raises
    BaselineError and is not touched.
    """
    target = _target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    stamp = saved_at or datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    with _locked(target.parent) as locked:
        if locked:
            _remove_stale_temps(target.parent)
        current = _current(target, known) or BaselineFile(target, {})
        head, texts = _merged(current, module, saves, stamp)
        _write(target, "".join([head_text(head), *(text for per_env in texts.values()
                                                   for text in per_env.values())]))
        kept = {(test, env_id) for test, per_env in texts.items() for env_id in per_env}
        return BaselineFile(path, head, _signature(os.stat(target)), texts=texts, kept=kept)


def save_test(path: Path, module: str, test: str, entries: Sequence[SaveEntry],
              saved_at: str | None = None) -> None:
    """Write ``test``'s baselines for the given environments into ``path``."""
    save_tests(path, module, [(test, entries)], saved_at)


def _merged(current: BaselineFile, module: str,
            saves: Sequence[tuple[str, Sequence[SaveEntry]]], stamp: str
            ) -> tuple[dict[str, Any], Texts]:
    """The head and the entries' texts (sorted) of ``current`` with the ``saves`` in it, in
    version 2: the other entries' texts as they are where a save writes them so already."""
    envs: dict[str, Any] = current.environments()
    texts: Texts = {}
    for test, entries in saves:
        for entry in entries:
            env_id = environment_id(entry.environment)
            table = environment_table(entry.environment)
            if "thresholds" in envs.get(env_id, {}):
                table["thresholds"] = envs[env_id]["thresholds"]
            envs[env_id] = table
            texts.setdefault(test, {})[env_id] = entry_text(test, env_id, entry_v2(
                stamp, {name: stored_metric_table(m) for name, m in entry.metrics.items()}))
    for test in current.tests():
        per_env = texts.setdefault(test, {})
        for env_id in current.test_environments(test):
            if env_id not in per_env:
                per_env[env_id] = current.entry_text(test, env_id)
    head = {"schema_version": SCHEMA_VERSION, "module": module, "environments": envs}
    return head, {test: dict(sorted(texts[test].items())) for test in sorted(texts)}


def _write(target: Path, text: str) -> None:
    """``text`` into ``target`` through a temporary file in :data:`TMP_DIRNAME` beside it
    (the caller holds the folder's lock), which is removed afterwards."""
    tmp_dir = target.parent / TMP_DIRNAME
    tmp_dir.mkdir(exist_ok=True)
    ignore = tmp_dir / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by pytest-distperf while it saves a baseline file\n*\n")
    try:
        write_atomically(target, text, tmp_dir=tmp_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _remove_stale_temps(folder: Path) -> list[Path]:
    """Remove what killed saves left in ``folder`` (the caller holds its lock, which every
    save holds while its temporary file exists: any there now is a dead writer's)."""
    stale = [p for p in folder.iterdir() if p.name == TMP_DIRNAME or _OLD_TMP.match(p.name)]
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
    return stale


def clean_stale_temps(root: Path) -> list[Path]:
    """Remove the temporary files of killed saves anywhere under the baseline folder
    ``root``, each folder under its lock; what was removed."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != TMP_DIRNAME]
        here = Path(folder)
        if TMP_DIRNAME not in os.listdir(here) and not any(_OLD_TMP.match(f) for f in files):
            continue
        with contextlib.suppress(OSError), _locked(here) as locked:
            if locked:
                removed += _remove_stale_temps(here)
    return removed


class SessionFiles:
    """The baseline files of one session: each read once, and what the session saves into
    each written when the caller says its module is done, in one read and one write."""

    def __init__(self, root: Path, *, sweep: bool = True) -> None:
        self.root = root
        self._read: dict[Path, BaselineFile | None] = {}
        self._unwritten: dict[Path, list[tuple[str, str, list[SaveEntry]]]] = {}
        self._swept = not sweep

    def path(self, key: str) -> Path:
        """The file of ``key`` (``module::test``)."""
        return baseline_path(self.root, key)

    def file(self, key: str) -> BaselineFile | None:
        """The parsed file of ``key``'s module (None when there is none yet); BaselineError
        when it cannot be read.  The first call clears what killed saves left."""
        if not self._swept:
            self._swept = True
            clean_stale_temps(self.root)
        path = self.path(key)
        if path not in self._read:
            self._read[path] = load(path)
        return self._read[path]

    def save(self, key: str, entries: Sequence[SaveEntry]) -> None:
        """Keep ``key``'s entries for the next :meth:`write`."""
        module, test = split_nodeid(key)
        self._unwritten.setdefault(self.path(key), []).append((module, test, list(entries)))

    def write(self, keep: str | None = None) -> list[str]:
        """Write every file saved into but ``keep``'s (the next test's key: more may come);
        the errors, one line each."""
        errors = []
        for path in [p for p in self._unwritten if keep is None or p != self.path(keep)]:
            saves = self._unwritten.pop(path)
            tests = [(test, entries) for _, test, entries in saves]
            try:
                self._read[path] = save_tests(path, saves[0][0], tests,
                                              known=self._read.get(path))
            except BaselineError as exc:
                errors.append(str(exc))
            except OSError as exc:
                errors.append(f"distperf: cannot write the baseline file {path}: {exc}; "
                              f"the baselines of {', '.join(t for t, _ in tests)} were not "
                              "saved")
        return errors
