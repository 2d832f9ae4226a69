"""Saving into a large baseline file (issue 39): a version-2 file is read entry by entry,
so that a save holds and rebuilds what it changes, not every other test's entry parsed, and
writes the bytes a rewrite of the whole file writes.  Pure unit tests on the store."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_distperf import verdict as bl
from pytest_distperf.records import EXACT, Environment, Measured, Samples
from pytest_distperf.verdict import store, storefile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CPU = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1)
CPU4 = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 4, "2.13.0+cpu", "", 4, 1)
MODULE = "tests/test_x.py"
STAMP = "2026-11-27T00:00:00Z"
V1_FILE = Path(__file__).parent / "data" / "baseline_v1_ddp_step.toml"
ENV, ENV4 = f'"{bl.environment_id(CPU)}"', f'"{bl.environment_id(CPU4)}"'  # as keys


def measured(rng: random.Random, n: int) -> bl.StoredMetric:
    """A time of ``n`` samples with its control, unrounded (a save rounds them)."""
    values = tuple(rng.uniform(0.02, 0.03) for _ in range(n))
    control = tuple(rng.uniform(0.002, 0.003) for _ in range(n))
    return bl.StoredMetric("s", False, Measured(values[0], Samples(values, control)))


def saves(tests: int, seed: int = 39) -> list[tuple[str, list[bl.SaveEntry]]]:
    """``tests`` tests of four times and a count each; every third in two environments."""
    rng = random.Random(seed)
    out = []
    for i in range(tests):
        metrics = {f"m{k}.time_s": measured(rng, 40) for k in range(4)}
        metrics["comm.calls"] = bl.StoredMetric("calls", False, Measured(3.0, Samples(())),
                                                kind=EXACT)
        envs = (CPU, CPU4) if i % 3 == 0 else (CPU,)
        out.append((f"test_{i:03d}[a.b]" if i == 1 else f"test_{i:03d}",
                    [bl.SaveEntry(env, metrics) for env in envs]))
    return out


def written(path: Path, tests: int) -> Path:
    """A file of ``tests`` tests as a save writes it."""
    bl.save_tests(path, MODULE, saves(tests), STAMP)
    return path


def save_new(path: Path, known: bl.BaselineFile | None = None) -> bytes:
    """Save a new test and a new measurement of ``test_002`` into ``path``; its bytes."""
    again = saves(3, seed=1)
    bl.save_tests(path, MODULE, [("test_new", again[0][1]), ("test_002", again[2][1])],
                  "2026-11-28T00:00:00Z", known=known)
    return path.read_bytes()


def as_a_whole_rewrite(path: Path) -> bytes:
    """What :func:`save_new` writes into ``path`` with the file parsed whole (every entry
    rebuilt and rendered: how saves were written before files were read entry by entry)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "read_entries", lambda *args, **kwargs: None)
        return save_new(path)


def edited(text: str, edit: str) -> str:
    """``text`` with one of the hand edits a reviewer or a merge makes."""
    head = f"[tests.test_002.{ENV}"
    at = text.index(head)
    if edit == "comment":
        return text.replace(f"{head}.metrics]\n", f"{head}.metrics]\n# looked at\n", 1)
    if edit == "unrounded":  # the first sample of test_002, to more digits than a save keeps
        start = text.index("values = [", at) + len("values = [")
        return text[:start] + "0.0212345678" + text[text.index(",", start):]
    if edit == "moved":  # test_000 after test_002: the entries out of order
        first = text.index("\n[tests.test_000.")
        entry = text[first:text.index('\n[tests."test_001', first)]
        return text.replace(entry, "", 1) + entry
    assert edit == "tomli_w"  # another TOML writer's layout of the same data
    return tomli_w.dumps(tomllib.loads(text))


# -- the bytes: as a whole rewrite writes them ------------------------------------------------
@pytest.mark.parametrize("edit", ["none", "comment", "unrounded", "moved", "tomli_w", "v1"])
def test_a_save_writes_the_bytes_a_whole_rewrite_writes(tmp_path: Path, edit: str) -> None:
    path = tmp_path / "a" / "test_x.toml"
    path.parent.mkdir()
    if edit == "v1":
        shutil.copy(V1_FILE, path)
    else:
        text = written(path, 6).read_text()
        path.write_text(text if edit == "none" else edited(text, edit))
    other = tmp_path / "b" / "test_x.toml"
    other.parent.mkdir()
    shutil.copy(path, other)
    assert save_new(path) == as_a_whole_rewrite(other)
    first = path.read_bytes()  # the same measurements saved again: the same bytes
    assert save_new(path) == first


# -- memory and work: what the save changes ---------------------------------------------------
def test_a_save_rebuilds_only_the_entries_it_saves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = bl.SessionFiles(tmp_path)
    key = f"{MODULE}::test_new"
    written(files.path(key), 40)
    assert files.file(key) is not None  # read as the session's first test reads it
    built: list[dict[str, Any]] = []

    def entry_v2(*args: Any) -> dict[str, Any]:
        built.append(storefile.entry_v2(*args))
        return built[-1]

    monkeypatch.setattr(store, "entry_v2", entry_v2)
    files.save(key, saves(1)[0][1])
    assert files.write() == []
    assert len(built) == 2  # test_new in its two environments; not the 40 other tests
    again = bl.load(files.path(key))
    assert again is not None and len(again.tests()) == 41


def test_a_file_read_for_a_save_holds_its_text_not_its_entries_parsed(tmp_path: Path) -> None:
    path = written(tmp_path / "test_x.toml", 40)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        file = bl.load(path)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        save_new(path, known=file)
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    # parsed whole, a file takes 3.9x its size, and a save of it 5.4x more
    assert held < 2 * size and peak < 3 * size, (held / size, peak / size)


def test_a_file_read_entry_by_entry_is_the_file_parsed_whole(tmp_path: Path) -> None:
    path = written(tmp_path / "test_x.toml", 6)
    file = bl.load(path)
    whole = storefile.parse(path, path.read_bytes())
    assert file is not None and file.data == whole
    assert file.tests() == sorted(whole["tests"])
    for test in file.tests():
        for env_id in file.test_environments(test):
            parsed = bl.BaselineFile(path, whole)
            assert file.metrics(test, env_id) == parsed.metrics(test, env_id)


# -- hand edits: read entry by entry only what the whole file gives the same ------------------
LINES = st.sampled_from([
    "[tests.test_000]", f"[tests.test_000.{ENV}]", "[tests.test_005.x]", "[tests.test_005.y]",
    f"[[tests.test_000.{ENV4}]]", f"[tests.test_000.{ENV}.metrics]", "[environments.x]",
    "[tests]", 'x = """', '"""', "value = 1", "samples = [", "]", "[1, 2]", "tests.a.b = 1",
    "schema_version = 1", "# a comment", "", "<<<<<<< HEAD", 'kind = "exact"', "saved = 1",
    "\x00"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["insert", "delete", "copy"]),
                          st.integers(0, 10**6), LINES), max_size=3))
def test_an_edited_file_reads_and_saves_as_the_whole_file_does(
        edits: list[tuple[str, int, str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = written(Path(tmp) / "test_x.toml", 6)
        lines = path.read_text().splitlines(keepends=True)
        for edit, where, line in edits:
            at = where % (len(lines) + 1)
            if edit == "insert":
                lines.insert(at, line + "\n")
            elif edit == "delete" and at < len(lines):
                del lines[at]
            elif edit == "copy":  # a stretch of lines twice, as a bad merge leaves them
                lines[at:at] = lines[at:at + 12]
        path.write_text("".join(lines))
        raw = path.read_bytes()
        try:
            whole: dict[str, Any] | None = storefile.parse(path, raw)
        except bl.BaselineError:
            whole = None
        by_entry = store.read_entries(path, raw)
        if whole is None or by_entry is None:
            assert by_entry is None  # refused, or read whole
            return
        assert by_entry.data == whole
        other = Path(tmp) / "other" / "test_x.toml"
        other.parent.mkdir()
        shutil.copy(path, other)
        assert save_new(path) == as_a_whole_rewrite(other)
