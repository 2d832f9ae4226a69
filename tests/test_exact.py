"""Exact and informational metrics, and the explanation a verdict carries: pure unit tests.

The end-to-end side (counting the collectives of a real DDP step on gloo ranks, and a
regression in their count failing a test with its explanation) is in tests/test_verdicts.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf import verdict as bl
from pytest_distperf.records import (
    EXACT,
    INFO,
    INFORMATIONAL,
    Environment,
    Measured,
    Measurement,
    Metric,
    Samples,
    Verdict,
)
from pytest_distperf.verdict import rule
from pytest_distperf.verdict.explain import explain
from pytest_distperf.verdict.judgement import exact_family
from pytest_distperf.verdict.noise import NoiseFigures

CPU = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "")
QUIET = NoiseFigures(1.0, 0.05, 0.08)
TIMES = tuple(0.020 + 0.0002 * i for i in range(20))
LABEL = "ddp_step_timer(ddp, 2 ranks)"


def exact(name: str, value: float, unit: str = "calls/step") -> Metric:
    return Metric(name, float(value), unit, False, kind=EXACT)


def timed(name: str, factor: float, kind: str = "") -> Metric:
    samples = tuple(v * factor for v in TIMES)
    return Metric(name, samples[10], "s", False, samples, kind=kind)


def step(calls: int = 2, nbytes: int = 4_000_000, buckets: int = 2, compute: float = 1.0,
         exposed: float = 1.0, slower: float = 1.0, barrier: int = 0) -> list[Metric]:
    out = [timed("step_time_s", slower), timed("compute_time_s", compute),
           timed("exposed_comm_s", exposed, INFORMATIONAL),
           exact("comm.all_reduce.calls", calls), exact("comm.all_reduce.bytes", nbytes, "B/step"),
           exact("comm.buckets", buckets, "buckets/step")]
    if barrier:
        out.append(exact("comm.barrier.calls", barrier))
    return out


def judgement(file: bl.BaselineFile | None, metrics: list[Metric], *, save: bool = False,
              exact_tolerance: float = 0.0) -> Any:
    measured = Measurement(LABEL, tuple(metrics), None, lambda: list(metrics))
    return bl.make_judgement(save=save, measurements=[measured], environment=CPU,
                             first_noise=QUIET, tolerance=0.10, baseline=file, test="test_a",
                             exact_tolerance=exact_tolerance)


def saved(tmp_path: Path, metrics: list[Metric]) -> bl.BaselineFile:
    j = judgement(None, metrics, save=True)
    while j.wanted():  # the measured metrics want their save measurements; same figures
        j.add_measurement(LABEL, metrics, QUIET)
    path = tmp_path / "test_x.toml"
    bl.save_test(path, "test_x.py", "test_a", j.save_entries())
    file = bl.load(path)
    assert file is not None
    return file


def verdicts_of(file: bl.BaselineFile, metrics: list[Metric], **kw: Any) -> dict[str, Any]:
    j = judgement(file, metrics, **kw)
    while j.wanted():  # confirmations of the measured metrics: the same figures again
        j.add_measurement(LABEL, metrics, QUIET)
    return {v.metric: v for v in j.verdicts()}


def test_counts_are_stored_to_the_unit_without_samples_or_noise(tmp_path: Path) -> None:
    file = saved(tmp_path, step(nbytes=2_105_344))
    entry = file.data["tests"]["test_a"][bl.environment_id(CPU)]
    table = entry["metrics"]
    assert table["comm.all_reduce.bytes"] == {"unit": "B/step", "higher_is_better": False,
                                              "value": 2_105_344, "kind": "exact",
                                              "tolerance": 0.0}
    assert "comm.all_reduce.bytes" not in entry["samples"]  # no samples, no noise
    assert table["exposed_comm_s"]["kind"] == "informational"
    assert table["compute_time_s"]["kind"] == "measured"  # judged with the step
    assert table["step_time_s"]["kind"] == "measured"
    stored = file.metrics("test_a", bl.environment_id(CPU))
    assert stored is not None and stored["comm.buckets"].kind == EXACT


def test_an_exact_metric_is_judged_at_once_and_exactly(tmp_path: Path) -> None:
    file = saved(tmp_path, step())
    j = judgement(file, step(calls=3))
    assert j.wanted() == []  # nothing to confirm: a count does not depend on the host
    v = {x.metric: x for x in j.verdicts()}
    calls = v["comm.all_reduce.calls"]
    assert (calls.verdict, calls.baseline, calls.current, calls.measurement_count) == (
        bl.REGRESSED, 2.0, 3.0, 1)
    assert calls.confidence is None and calls.detail.startswith(
        "regressed: 2 -> 3 calls/step (+1), past the exact tolerance of 0; find the change")
    assert v["comm.all_reduce.bytes"].verdict == bl.UNCHANGED
    fewer = verdicts_of(file, step(calls=1))["comm.all_reduce.calls"]
    assert fewer.verdict == bl.IMPROVED and "re-save" in fewer.detail
    # one byte is a change; an exact tolerance lets it through
    assert verdicts_of(file, step(nbytes=4_000_001))["comm.all_reduce.bytes"].verdict \
        == bl.REGRESSED
    loose = verdicts_of(file, step(nbytes=4_000_064), exact_tolerance=64)
    assert loose["comm.all_reduce.bytes"].verdict == bl.UNCHANGED


def test_a_new_collective_counts_from_zero_and_a_vanished_one_is_reported(
        tmp_path: Path) -> None:
    file = saved(tmp_path, step())
    v = verdicts_of(file, step(barrier=1))
    barrier = v["comm.barrier.calls"]
    assert (barrier.verdict, barrier.baseline, barrier.current) == (bl.REGRESSED, 0.0, 1.0)
    assert barrier.explanation == "barrier: new, 1 call(s)/step: an extra barrier in the step?"
    back = verdicts_of(saved(tmp_path, step(barrier=1)), step())
    gone = back["comm.barrier.calls"]
    assert (gone.verdict, gone.baseline, gone.current) == (bl.IMPROVED, 1.0, 0.0)
    assert gone.explanation == "barrier: no longer issued (was 1 call(s)/step)"
    # a measurement without counts (count_collectives=False) does not make them all vanish
    plain = [m for m in step() if m.kind != EXACT]
    assert not any(x.kind == EXACT for x in verdicts_of(file, plain).values())
    # nor does a run in an environment the baseline does not match
    other = dataclasses.replace(CPU, device_count=1)  # the same key, a different field
    measured = Measurement(LABEL, tuple(step()), None, None)
    j = bl.make_judgement(save=False, measurements=[measured], environment=other,
                          first_noise=QUIET, tolerance=0.10,
                          baseline=saved(tmp_path, step(barrier=1)), test="test_a")
    verdicts = {v.metric: v.verdict for v in j.verdicts()}
    assert "comm.barrier.calls" not in verdicts
    assert verdicts["comm.all_reduce.calls"] == bl.NOT_COMPARABLE


def test_informational_metrics_are_compared_and_never_fail(tmp_path: Path) -> None:
    file = saved(tmp_path, step())
    j = judgement(file, step(exposed=3.0))
    assert j.wanted() == []
    v = {x.metric: x for x in j.verdicts()}
    exposed = v["exposed_comm_s"]
    assert exposed.verdict == INFO and exposed.change == pytest.approx(2.0)
    assert "never a failure" in exposed.detail


def test_a_step_regression_says_what_changed_with_it(tmp_path: Path) -> None:
    file = saved(tmp_path, step())
    v = verdicts_of(file, step(calls=18, buckets=18, slower=1.5, compute=1.0, exposed=3.3))
    assert v["step_time_s"].verdict == bl.REGRESSED  # past the tolerance: it stands
    assert v["comm.all_reduce.calls"].verdict == bl.REGRESSED
    assert v["step_time_s"].explanation == (
        "all_reduce calls/step 2 -> 18, bytes unchanged: smaller gradient buckets "
        "(bucket_cap_mb)?; gradient buckets/step 2 -> 18: smaller buckets (bucket_cap_mb)?; "
        "compute unchanged, exposed communication +230%")
    compute = verdicts_of(file, step(slower=1.3, compute=1.14))["step_time_s"]
    assert compute.explanation == ("collective calls and bytes unchanged; compute +14%, "
                                   "exposed communication unchanged")
    unused = verdicts_of(file, step(calls=3, nbytes=4_000_064))
    assert unused["comm.all_reduce.calls"].explanation == (
        "all_reduce calls/step 2 -> 3, bytes/step 3.81 MiB -> 3.81 MiB (+0.0%): a small extra "
        "message per step (find_unused_parameters' used-parameter map? a new all_reduce of a "
        "scalar?)")
    bigger = verdicts_of(file, step(nbytes=5_000_000))["comm.all_reduce.bytes"]
    assert bigger.explanation == ("all_reduce bytes/step 3.81 MiB -> 4.77 MiB (+25.0%), calls "
                                  "unchanged: more data per call (a larger model?)")
    assert verdicts_of(file, step())["step_time_s"].explanation == ""  # unchanged


def test_a_save_says_when_a_count_was_not_deterministic() -> None:
    j = judgement(None, step(), save=True)
    j.add_measurement(LABEL, step(calls=3), QUIET)
    while j.wanted():
        j.add_measurement(LABEL, step(), QUIET)
    v = {x.metric: x for x in j.verdicts()}
    assert v["comm.all_reduce.calls"].current == 2.0
    assert "NOT deterministic: 2 values" in v["comm.all_reduce.calls"].detail
    assert v["comm.all_reduce.bytes"].detail == "exact"


@pytest.mark.parametrize(("name", "family"), [
    ("comm.all_reduce.calls", "comm."), ("gpt.comm.buckets", "gpt.comm."),
    ("comm.all_reduce.bytes#2", "comm.#2"), ("comm.all_reduce[ranks 0,1].calls", "comm."),
    ("step_time_s", ""), ("profile.comm_overhead", ""),
    ("device.syncs", "device.syncs."), ("device.syncs.aten::item", "device.syncs."),
    ("gpt.device.syncs.aten::item#2", "gpt.device.syncs.#2"), ("device.launches", ""),
])
def test_exact_families(name: str, family: str) -> None:
    assert exact_family(name) == family


def test_explanations_stay_within_their_measurement() -> None:
    a = Verdict("a.step_time_s", bl.REGRESSED, change=0.5)
    b = Verdict("b.comm.all_reduce.calls", bl.REGRESSED, baseline=2, current=9, kind=EXACT)
    out = {v.metric: v for v in explain([a, b], {a.metric: "A", b.metric: "B"}, 0.1)}
    assert out["a.step_time_s"].explanation == ""
    assert out["b.comm.all_reduce.calls"].explanation == "all_reduce calls/step 2 -> 9"
    # dist_profiler counts per profiled call (unit "calls", not "calls/step")
    c = Verdict("profile.comm.all_reduce.calls", bl.REGRESSED, unit="calls", baseline=3,
                current=24, kind=EXACT)
    d = Verdict("profile.comm.all_reduce.bytes", bl.UNCHANGED, unit="B", baseline=8,
                current=8, kind=EXACT)
    out = {v.metric: v for v in explain([c, d], {c.metric: "P", d.metric: "P"}, 0.1)}
    assert out[c.metric].explanation == ("all_reduce calls per profiled call 3 -> 24, bytes "
                                         "unchanged: smaller gradient buckets (bucket_cap_mb)?")


def test_a_step_is_judged_on_its_own_and_explained_by_its_parts(tmp_path: Path) -> None:
    """A step time is judged by its own measurements, whatever its compute did; the
    explanation says where the change lies (its compute, its exposed communication)."""
    file = saved(tmp_path, step())
    # the step 15% slower (past the 10% tolerance), its compute as saved
    v = verdicts_of(file, step(slower=1.15, exposed=1.5))
    assert v["compute_time_s"].verdict == bl.UNCHANGED
    assert v["step_time_s"].verdict == bl.REGRESSED
    assert v["step_time_s"].change == pytest.approx(0.15)
    assert "exposed communication +50%" in v["step_time_s"].explanation
    # the compute slower too: both regressed
    both = verdicts_of(file, step(slower=1.15, compute=1.3))
    assert (both["step_time_s"].verdict, both["compute_time_s"].verdict) == (
        bl.REGRESSED, bl.REGRESSED)
    assert "compute +30%" in both["step_time_s"].explanation
    # the compute slower alone (the step hid it behind its communication): it fails the test
    hidden = verdicts_of(file, step(compute=1.3))
    assert (hidden["step_time_s"].verdict, hidden["compute_time_s"].verdict) == (
        bl.UNCHANGED, bl.REGRESSED)


def test_a_verdict_says_how_many_re_measurements_ran_on_fresh_ranks(tmp_path: Path) -> None:
    """The caller tells the judgement which measurements were repeated on fresh ranks only;
    their verdicts say so, and a step is still judged with its compute."""
    file = saved(tmp_path, step())
    metrics = step(slower=1.15, exposed=1.5)
    for fresh in (set(), {LABEL}):
        j = judgement(file, metrics)
        while j.wanted():
            j.add_measurement(LABEL, metrics, QUIET)
        j.fresh_labels = fresh
        v = {x.metric: x for x in j.verdicts()}
        assert v["step_time_s"].verdict == bl.REGRESSED
        for name in ("step_time_s", "compute_time_s"):
            # no control here: the plain rule
            assert v[name].measurement_count == rule._CONFIRMATIONS + 1
            said = f"{rule._CONFIRMATIONS} re-measurement(s) on fresh ranks"
            assert v[name].detail.endswith(said) == bool(fresh), v[name].detail
        assert "fresh ranks" not in v["comm.all_reduce.calls"].detail  # measured once
        # every measurement's samples, and what the noise probe saw, come with the verdict
        # (to judge it again from the record); an exact metric has none
        by_name = {m.name: m for m in metrics}
        step_time = by_name["step_time_s"]
        assert v["step_time_s"].measurements == tuple(
            Measured(step_time.value, Samples(step_time.samples), QUIET.steal, QUIET.wait,
                     QUIET.other_load) for _ in range(rule._CONFIRMATIONS + 1))
        assert v["comm.all_reduce.calls"].measurements == ()


def test_an_explanation_names_what_the_test_asked_for_differently() -> None:
    """A mesh or a schedule changed since the save: the counts moved because the layout
    did (informational metrics, which fail nothing themselves)."""
    step = Verdict("step_time_s", bl.REGRESSED, change=0.4)
    layout = [Verdict("mesh.dp", INFO, unit="ranks", baseline=2, current=1),
              Verdict("mesh.tp", INFO, unit="ranks", baseline=2, current=4),
              Verdict("mesh.pp", INFO, unit="ranks", baseline=None, current=2),  # an older
              # baseline, saved before the layout was recorded, says nothing of it
              Verdict("comm.dp.all_gather.calls", bl.IMPROVED, baseline=5, current=0,
                      kind=EXACT),
              Verdict("comm.dp.reduce_scatter.calls", bl.UNCHANGED, baseline=3, current=3,
                      kind=EXACT),
              Verdict("comm.dp.reduce_scatter.bytes", bl.REGRESSED, baseline=1024,
                      current=2048, kind=EXACT)]
    out = {v.metric: v for v in explain([step, *layout], dict.fromkeys(
        ["step_time_s", *(v.metric for v in layout)], "L"), 0.1)}
    # the layout moved the counts: no guess at a larger model
    assert out["step_time_s"].explanation == (
        "mesh dp 2 -> 1, tp 2 -> 4; dp.all_gather: no longer issued (was 5 call(s)/step); "
        "dp.reduce_scatter bytes/step 1 KiB -> 2 KiB (+100.0%), calls unchanged")
    util = Verdict("pipeline.utilisation", bl.REGRESSED, change=-0.2)
    theory = Verdict("pipeline.bubble_theory", INFO, baseline=0.2,
                     current=1 / 3)
    out = {v.metric: v for v in explain([util, theory], dict.fromkeys(
        [util.metric, theory.metric], "P"), 0.1)}
    assert out[util.metric].explanation == (
        "the schedule's bubble in theory 0.200 -> 0.333 (microbatches or stages changed)")
    # a test that names its measurement "mesh": its metrics are no layout
    named = [Verdict("mesh.step_time_s", bl.REGRESSED, change=0.4, baseline=0.1, current=0.2),
             Verdict("mesh.exposed_comm_s", INFO, unit="s", baseline=0.01, current=0.02)]
    out = {v.metric: v for v in explain(named, dict.fromkeys([v.metric for v in named], "M"),
                                        0.1)}
    assert not out["mesh.step_time_s"].explanation.startswith("mesh")


# -- device figures of a GPU step (issue 47) ------------------------------------------------------
def gpu_step(syncs: tuple[str, ...] = (), launches: int = 480, peak: int = 3 * 2**30,
             slower: float = 1.0) -> list[Metric]:
    """A GPU step's metrics as ``step_metrics`` makes them from the counted step's device
    figures (two ranks; the second launched one kernel less) and the allocator's peak."""
    from pytest_distperf.fixtures.results.steps import DeviceFigures, device_metrics
    from pytest_distperf.records import PEAK

    figures = (DeviceFigures(0, launches, 0, syncs, 4096, len(syncs) * 4),
               DeviceFigures(1, launches - 1, 0, syncs, 4096, len(syncs) * 4))
    return [timed("step_time_s", slower), *device_metrics(figures, "device.", 2),
            Metric("peak_memory_bytes", float(peak), "B", False, kind=PEAK)]


def test_device_figures_are_exact_metrics_the_most_any_rank_did() -> None:
    metrics = {m.name: m for m in gpu_step(syncs=("aten::item", "aten::item", "aten::nonzero"))}
    assert metrics["device.launches"].value == 480 and metrics["device.launches"].kind == EXACT
    assert metrics["device.syncs"].value == 3
    assert metrics["device.syncs.aten::item"].value == 2
    assert metrics["device.syncs.aten::nonzero"].value == 1
    assert metrics["device.d2h_bytes"].value == 12 and metrics["device.h2d_bytes"].value == 4096
    assert "device.graph_launches" not in metrics  # none launched
    assert not {m.name for m in gpu_step()} & {"device.syncs.aten::item"}


def test_an_item_in_the_loss_fails_as_a_host_sync_named_by_its_op(tmp_path: Path) -> None:
    """Issue 47: a ``.item()`` added to a loss fails as "host syncs per step 0 -> 1", and the
    op that made the host wait fails with it, by name, though the baseline never saw it."""
    file = saved(tmp_path, gpu_step())
    v = verdicts_of(file, gpu_step(syncs=("aten::item",)))
    assert v["device.syncs"].verdict == bl.REGRESSED
    assert v["device.syncs"].detail.startswith("regressed: 0 -> 1 syncs/step (+1)")
    assert v["device.syncs.aten::item"].verdict == bl.REGRESSED
    assert v["device.d2h_bytes"].verdict == bl.REGRESSED
    assert v["device.launches"].verdict == bl.UNCHANGED
    assert v["device.syncs"].explanation.startswith(
        "host syncs/step in aten::item 0 -> 1: a .item(), .cpu(), print(tensor) or nonzero() "
        "in the step?")
    # and saved with it, removing it again is an improvement of both, by name
    back = verdicts_of(saved(tmp_path, gpu_step(syncs=("aten::item",))), gpu_step())
    assert back["device.syncs"].verdict == bl.IMPROVED
    assert back["device.syncs.aten::item"].verdict == bl.IMPROVED


def test_a_site_of_the_peak_the_save_did_not_keep_counts_from_0(tmp_path: Path) -> None:
    """A site of the peak (``peak_memory_bytes.at.<site>``) whose line moved since the save,
    or that was not among the largest then, is compared from 0 and stays informational:
    never "no baseline" (no re-save asked for), never a failure; the peak names it."""
    def site(name: str, mib: int) -> Metric:
        return Metric(f"peak_memory_bytes.at.{name}", float(mib * 2**20), "B", False,
                      kind=INFORMATIONAL)

    file = saved(tmp_path, [*gpu_step(), site("model.py:88:forward", 5)])
    v = verdicts_of(file, [*gpu_step(peak=4 * 2**30), site("model.py:90:forward", 5)])
    moved = v["peak_memory_bytes.at.model.py:90:forward"]
    assert (moved.verdict, moved.baseline) == (INFO, 0.0)
    assert v["peak_memory_bytes"].verdict == bl.REGRESSED
    assert ("grew at the peak: model.py:90 in forward 5 MiB (not among the largest at the "
            "save)") in v["peak_memory_bytes"].explanation
    # a baseline saved with no sites at all: a site is new there
    v = verdicts_of(saved(tmp_path, gpu_step()), [*gpu_step(), site("model.py:90:forward", 5)])
    assert v["peak_memory_bytes.at.model.py:90:forward"].verdict == bl.NO_BASELINE


def test_a_peak_of_device_memory_is_judged_within_its_bound(tmp_path: Path) -> None:
    """Activations kept for longer: the same FLOPs and counts, 20% more peak memory, fails
    with both figures; the allocator's rounding (well under 1%) passes."""
    file = saved(tmp_path, gpu_step())
    v = verdicts_of(file, gpu_step(peak=int(3.6 * 2**30)))
    assert v["peak_memory_bytes"].verdict == bl.REGRESSED
    assert v["peak_memory_bytes"].detail.startswith(
        "regressed: peak device memory 3 GiB -> 3.6 GiB (+20.0%), past its 1% bound")
    assert verdicts_of(file, gpu_step(peak=3 * 2**30 + 2**20))["peak_memory_bytes"].verdict \
        == bl.UNCHANGED
    assert verdicts_of(file, gpu_step(peak=int(2.5 * 2**30)))["peak_memory_bytes"].verdict \
        == bl.IMPROVED
    text = (tmp_path / "test_x.toml").read_text()
    assert 'kind = "peak"' in text and "tolerance = 0.01" in text
