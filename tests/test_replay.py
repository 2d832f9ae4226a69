"""The verdict rule on real recorded runs: benchmarks/replay.py and benchmarks/data/.

The recorded runs are end-to-end runs of benchmarks/verdict_quality.py on this project's
2-core VM (real gloo ranks; every measurement's samples, controls and noise figures, and the
baseline files as stored).  Judged again, they must come out as they did; and on a host that
moved between the save and the compare runs (the case of R33: every time and control of a
compare run 10% slower), no clean run may be called regressed.  A change of the rule that
changes a recorded verdict fails here on purpose: record new runs with the changed rule
(``verdict_quality.py --json``), keep them in benchmarks/data/ and say in
benchmarks/verdict_quality.md what moved and why.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
METRIC = "matmul.time_s"


@pytest.fixture(scope="module")
def replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replay", BENCHMARKS / "replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["replay"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def judged_as_recorded(replay: ModuleType, name: str, metric: str) -> list[Any]:
    """The 50 compare runs of recording ``name``, each asserted to come out of the rule as it
    is with the verdict it recorded, after as many measurements."""
    runs = list(replay.compare_runs(replay.load_runs(BENCHMARKS / "data" / name), metric))
    assert len(runs) == 50
    for run in runs:
        verdict, used, detail = replay.judge(run.base, replay.measurements(run.measurements,
                                                                           1.0, 1.0))
        assert (verdict, used) == (run.verdict, len(run.measurements)), detail
    return runs


def test_recorded_runs_are_judged_again_as_they_were(replay: ModuleType) -> None:
    """R44 (a steady host) was run with the rule as it is: every verdict, and the number of
    measurements it took, comes out the same from the record."""
    runs = judged_as_recorded(replay, "r44.json.gz", METRIC)
    verdicts = {run.verdict for run in runs}
    assert {"regressed", "unchanged"} <= verdicts  # both kinds of verdict are in the record


def test_noisy_measurements_judged_when_none_is_quiet(replay: ModuleType) -> None:
    """R45 (a noisy neighbour: noisy measurements set aside by their recorded noise
    figures), judged again: every verdict as recorded but one, where the rule it ran with
    called the run inconclusive for want of a quiet measurement and the rule now judges
    the noisy ones pooled: the clean run #43 unchanged.  The 20% slowdown #31, seen only in
    noisy measurements, stays inconclusive: noise alone never makes a regression.  A noisy
    measurement near the baseline now clears a run, so none takes more measurements than
    it did."""
    runs = list(replay.compare_runs(replay.load_runs(BENCHMARKS / "data" / "r45.json.gz"),
                                    METRIC))
    moved = {}
    for i, run in enumerate(runs):
        verdict, used, detail = replay.judge(run.base, replay.measurements(run.measurements,
                                                                           1.0, 1.0))
        assert used <= len(run.measurements), (i, detail)
        if verdict != run.verdict:
            moved[i] = (run.extra, run.verdict, verdict)
    assert moved == {43: (0.0, "inconclusive", "unchanged")}


def test_a_host_that_moved_since_the_save_false_alarms_nothing(replay: ModuleType) -> None:
    """R42's 45 clean runs, as if the host had run 10% slower (and 10% faster) at every
    compare run than at the save, the loop following it 1:1: judged by the fitted slope
    alone, 11 were called regressed (and 14 improved); judged at the fit and 1:1, none.
    The slowed runs are still caught, or said to be inconclusive, never cleared."""
    data = replay.load_runs(BENCHMARKS / "data" / "r42.json.gz")
    for host in (0.1, -0.1):
        tally = replay.replay(data, METRIC, host, 1.0)
        clean = tally[0.0]
        assert sum(clean.values()) == 45
        assert clean["regressed"] == 0 and clean["improved"] == 0, (host, clean)
        for extra in (0.1, 0.2):
            assert set(tally[extra]) <= {"regressed", "inconclusive"}, (host, tally[extra])
        assert tally[0.2]["regressed"] == 15
    assert replay.replay(data, METRIC, 0.1, 1.0)[0.0]["inconclusive"] > 0  # not told: said so


BUSBW = "all_reduce.4MiB.busbw_gbps"


@pytest.mark.parametrize(("name", "recorded"), [("r47.json.gz", 2), ("r52.json.gz", 1)])
def test_a_measurement_slowed_alone_false_alarms_nothing(replay: ModuleType, name: str,
                                                         recorded: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """R47's and R52's `bench` blocks (a gloo all-reduce's bus bandwidth, the host steady):
    their 3 false alarms came from measurements slowed alone (one at half the bandwidth of
    its five siblings; three of six in a slow regime).  With such measurements set aside
    (``readings._OUTLIER_LIMIT``) none is left, and every slowdown caught then is caught now."""
    data = replay.load_runs(BENCHMARKS / "data" / name)
    tally = replay.replay(data, BUSBW, 0.0, 1.0)
    assert sum(tally[0.0].values()) == 30 and tally[0.0]["regressed"] == 0, tally[0.0]
    assert tally[0.1]["regressed"] >= 9 and tally[0.2]["regressed"] == 10, tally
    from pytest_distperf.verdict import readings

    monkeypatch.setattr(readings, "_OUTLIER_LIMIT", float("inf"))  # the rule as recorded
    assert replay.replay(data, BUSBW, 0.0, 1.0)[0.0]["regressed"] == recorded


def test_replay_refuses_a_file_it_cannot_read(replay: ModuleType, tmp_path: Path) -> None:
    bad = tmp_path / "runs.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        replay.load_runs(bad)
    empty = tmp_path / "empty.json"
    empty.write_text('{"runs": []}')
    with pytest.raises(SystemExit, match="no compare run"):
        replay.main([str(empty)])


def test_a_drift_the_memory_control_follows_false_alarms_less(
        replay: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """R59 (ddp_verdicts.py: a real DDP step on 2 gloo ranks, every sample with both
    controls; the host steady) replayed with the drift two watchers measured on 2026-11-24
    put in: the compute control 12.6% slower, the memory control 17.1%, the step 21.2%.
    Judged without the memory control every clean run is a false alarm; with it (the host's
    change taken out at the slope the two controls' changes say, as well) at most 4 in 20,
    the others inconclusive, and every slowdown is still caught.  As recorded, nothing
    moves."""
    data = replay.load_runs(BENCHMARKS / "data" / "r59.json.gz")
    tally = replay.replay(data, "step_time_s", 0.0, 1.0)
    assert tally[0.0]["unchanged"] == 20 and tally[0.1]["regressed"] == 10, tally
    for metric in ("step_time_s", "compute_time_s"):
        drift = replay.replay(data, metric, 0.126, 1.0, 0.171, 0.212)
        assert sum(drift[0.0].values()) == 20, drift
        assert drift[0.0]["regressed"] <= 4 and drift[0.1]["regressed"] == 10, drift
        assert set(drift[0.0]) <= {"regressed", "inconclusive"}, drift
    from pytest_distperf.verdict import readings

    monkeypatch.setattr(readings, "has_memory_control", lambda base, measured: False)
    drift = replay.replay(data, "step_time_s", 0.126, 1.0, 0.171, 0.212)
    assert drift[0.0]["regressed"] == 20, drift


def test_a_bandwidth_must_hold_in_proportion_to_the_memory_control(
        replay: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """R61 (`bench`: a 4 MiB gloo all-reduce's bus bandwidth; every call with both
    controls): in block 1 the memory control ran 10-20% faster than at the save, the compute
    control within 2%, and clean runs read 5-23% better; at block 2's end it ran 5-19%
    slower and two clean runs read 9% and 17% worse.  A gloo all-reduce on CPU is copies and
    adds of buffers, what the memory control does: with a bandwidth's verdict asked to hold
    with the memory control's change taken out 1:1 as well, none of those is called, and
    every slowdown caught before is caught."""
    data = replay.load_runs(BENCHMARKS / "data" / "r61.json.gz")
    tally = replay.replay(data, BUSBW, 0.0, 1.0)
    assert sum(tally[0.0].values()) == 30, tally
    assert tally[0.0]["regressed"] == 0 and tally[0.0]["improved"] == 0, tally
    assert tally[0.1]["regressed"] == 6 and tally[0.2]["regressed"] == 9, tally
    from pytest_distperf.verdict import readings

    monkeypatch.setattr(readings, "has_memory_control", lambda base, measured: False)
    before = replay.replay(data, BUSBW, 0.0, 1.0)
    assert (before[0.0]["regressed"], before[0.0]["improved"]) == (2, 4), before
    assert before[0.1]["regressed"] == 6 and before[0.2]["regressed"] == 9, before


def test_a_baseline_of_fewer_measurements_errs_more(replay: ModuleType) -> None:
    """The case for a save of twelve measurements (DEFAULT_SAVE_MEASUREMENTS), on R52 (`bench`,
    two blocks): rebuilt from three of its save's six measurements (the first, the last,
    the odd or the even three), a baseline leaves its runs erring more than rebuilt from all
    six: false alarms, false improvements, clean runs left inconclusive and missed
    slowdowns, 50 in four replays against 4 x 4.  (R47: 56 against 32; R61: 36 and 36;
    verdict_quality.md, R65.)  And the rebuild is the save's own: R61's, from all six
    measurements, is the baseline as stored."""
    def errors(tally: dict) -> int:
        clean = tally[0.0]
        missed = sum(sum(c.values()) - c["regressed"] for e, c in tally.items() if e)
        return clean["regressed"] + clean["improved"] + clean["inconclusive"] + missed

    data = replay.load_runs(BENCHMARKS / "data" / "r52.json.gz")
    six = errors(replay.replay(data, BUSBW, 0.0, 1.0, save_pick=list(range(6))))
    three = [errors(replay.replay(data, BUSBW, 0.0, 1.0, save_pick=pick))
             for pick in ([0, 1, 2], [3, 4, 5], [0, 2, 4], [1, 3, 5])]
    assert (six, three) == (4, [20, 8, 16, 6])
    for run in list(replay.compare_runs(replay.load_runs(BENCHMARKS / "data" / "r61.json.gz"),
                                        BUSBW))[::25]:  # one run of each block
        again = replay.rebuilt(run.base, run.saved, list(range(6)), run.save_level).samples
        assert again.values == pytest.approx(run.base.samples.values, rel=1e-5)
        assert again.control == pytest.approx(run.base.samples.control, rel=1e-5)
        assert again.sizes == run.base.samples.sizes


def test_a_bench_block_with_saves_of_twelve_is_judged_again_as_it_was(
        replay: ModuleType) -> None:
    """R69 (`bench`, saves of twelve measurements, the rule as it is; kept rounded to six
    significant digits): every one of its 50 verdicts, and the measurements it took, comes
    out the same from the record: 0/30 false alarms, 6/10 and 10/10 caught."""
    runs = judged_as_recorded(replay, "r69.json.gz", BUSBW)
    assert max(len(run.base.samples.sizes) for run in runs) == 12
    tally = replay.replay(replay.load_runs(BENCHMARKS / "data" / "r69.json.gz"), BUSBW, 0.0,
                          1.0)
    assert (tally[0.0]["regressed"], tally[0.1]["regressed"], tally[0.2]["regressed"]) == (
        0, 6, 10), tally


@pytest.fixture(scope="module")
def detectable(replay: ModuleType) -> ModuleType:
    # ``replay`` first: benchmarks/detectable.py imports it, from sys.modules
    spec = importlib.util.spec_from_file_location("detectable", BENCHMARKS / "detectable.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_what_a_save_can_tell_separates_the_kinds_as_their_runs_did(
        detectable: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/detectable.py on the kept records: a matmul loop's saves (R44) tell a
    change of 0.6% and 1.1%, and their blocks caught every 10% slowdown; a gloo
    all-reduce's saves (R61, R69) tell 8-15%, more than the 10% tolerance in one block of
    each, and their blocks caught 6/10 in each record (verdict_quality.md, R69)."""
    def figures(name: str, metric: str) -> list[tuple[float, int, int]]:
        out = []
        for block in detectable.blocks(detectable.replay.load_runs(
                BENCHMARKS / "data" / name), metric):
            d = block["detectable"]
            caught = block["tally"][0.1]
            out.append((d.change, caught["regressed"], sum(caught.values())))
        return out

    loop = figures("r44.json.gz", METRIC)
    assert len(loop) == 2 and all(c < 0.02 and got == of for c, got, of in loop), loop
    for name in ("r61.json.gz", "r69.json.gz"):
        bus = figures(name, BUSBW)
        assert len(bus) == 2 and max(c for c, _, _ in bus) > 0.10, bus
        assert all(0.08 < c < 0.16 for c, _, _ in bus), bus
        assert sum(got for _, got, _ in bus) == 6 and sum(of for _, _, of in bus) == 10, bus
    detectable.main([str(BENCHMARKS / "data" / "r44.json.gz")])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("detectable")[1][:8] for line in printed] == ["   0.6%;", "   1.1%;"]


@pytest.mark.parametrize(("name", "most"), [
    ("r73.json.gz", {"py.time_s": 0, "mm.time_s": 0, "ar.time_s": 0}),
    ("r72.json.gz", {"py.time_s": 1, "mm.time_s": 0, "ar.time_s": 0}),
    ("r74.json.gz", {"py.time_s": 0, "mm.time_s": 0, "ar.time_s": 0}),
])
def test_micro_work_compared_unchanged_is_not_called_regressed(
        replay: ModuleType, name: str, most: dict[str, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49's micro-work (0.13 ms of Python, a 64 x 64 matmul loop, a 64 KiB gloo
    all-reduce), saved and compared unchanged: R73 on the quiet VM (2 saves, 10 compares),
    R72 beside busy neighbours (3 saves, 23 compares), each baseline rebuilt as a save takes
    it now, judged at the default tolerance; R74 on the quiet VM again (2 saves, 10
    compares).  As recorded, R72 and R73 false-alarmed 2 of 30 and 21 of 69 before issue
    49, R74 2 of 30; the one left is explained in benchmarks/verdict_quality.md (two host
    regimes 86% apart)."""
    monkeypatch.setattr(replay, "TOLERANCE", 0.10)
    data = replay.load_runs(BENCHMARKS / "data" / name)
    for metric, at_most in most.items():
        clean = replay.replay(data, metric, 0.0, 1.0, save_now=True)[0.0]
        assert clean["regressed"] <= at_most and clean["improved"] == 0, (metric, clean)


def test_a_host_whose_neighbours_got_busy_since_the_save_false_alarms_nothing(
        replay: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """R73's `mm` (ten 64 x 64 matmuls, 0.17 ms), block 2, saved with no host steal: in one
    compare run every measurement read 9-28% slower than the save (+16.9% pooled), the
    compute control 3% slower, the memory control 18%, with 3-9% of the CPU stolen by the
    hypervisor in each.  Other guests of the host were busy, so the memory control's move is
    theirs, not its own: the memory reading takes it out past its cap
    (``readings.stolen_since``), and the run is inconclusive.  With the cap kept, it is the
    record's one false alarm.  Every clean run of the record made 15% slower is still
    caught."""
    from pytest_distperf.verdict import readings

    monkeypatch.setattr(replay, "TOLERANCE", 0.10)
    data = replay.load_runs(BENCHMARKS / "data" / "r73.json.gz")
    run = list(replay.compare_runs(data, "mm.time_s"))[6]
    base = replay.saved_now(run.base, run.saved, run.save_level)[0]
    measured = replay.measurements(run.measurements, 1.0, 1.0)
    assert base.measured.steal == 0.0 and readings.stolen_since(base, measured)
    verdict, used, detail = replay.judge(base, measured)
    assert (verdict, used) == ("inconclusive", 6), detail
    assert "the host's memory ran 18% slower" in detail
    slowed = replay.replay(data, "mm.time_s", 0.0, 1.0, time_change=0.15, save_now=True)
    assert slowed[0.0]["regressed"] == 10, slowed
    monkeypatch.setattr(readings, "stolen_since", lambda base, measured: False)
    assert replay.judge(base, measured)[0] == "regressed"  # the rule before


def test_a_host_whose_memory_alone_slowed_since_the_save_false_alarms_nothing(
        replay: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """R74's `mm`, block 2: in two compare runs every measurement read 11-13% slower than the
    save as measured, the compute control 3% faster, the memory control 16% and 23% slower,
    with little steal.  The host's memory alone slowed by more than the change, and how much
    of that a 64 x 64 matmul follows is not known: inconclusive, not regressed
    (``readings.memory_alone`` in ``rule._beyond_memory``).  Without it they are the record's
    two false alarms.  Of the record's clean runs made 15% slower it loses one catch of five,
    where the memory control ran 37% slower than the compute one (the five of block 1, the
    host 5% faster than at the save, read under the line as measured either way)."""
    from pytest_distperf.verdict import rule

    monkeypatch.setattr(replay, "TOLERANCE", 0.10)
    data = replay.load_runs(BENCHMARKS / "data" / "r74.json.gz")
    runs = [run for run in replay.compare_runs(data, "mm.time_s") if run.block == 2]
    judged = []
    for run in runs[1:4:2]:
        base = replay.saved_now(run.base, run.saved, run.save_level)[0]
        measured = replay.measurements(run.measurements, 1.0, 1.0)
        verdict, _, detail = replay.judge(base, measured)
        assert verdict == "inconclusive", detail
        assert "the host's memory slowed" in detail and "own move" in detail, detail
        judged.append((base, measured))
    slowed = replay.replay(data, "mm.time_s", 0.0, 1.0, time_change=0.15, save_now=True)
    assert slowed[0.0]["regressed"] == 4, slowed
    monkeypatch.setattr(rule, "memory_alone", lambda readings: 0.0)
    assert [replay.judge(*pair)[0] for pair in judged] == ["regressed", "regressed"]
    slowed = replay.replay(data, "mm.time_s", 0.0, 1.0, time_change=0.15, save_now=True)
    assert slowed[0.0]["regressed"] == 5, slowed
