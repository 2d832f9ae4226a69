"""What held a GPU step's peak of device memory, and what grew since the save (issue 47):
the allocator snapshot read on CPU from a file in torch's format, the rank's recording
degrading to no sites, the step timer's metrics and a peak regression's explanation."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf.analysis.analyzer import analyze_steps
from pytest_distperf.common.peaksites import BEFORE, NO_FRAME, grew, sites_at_peak, under
from pytest_distperf.fixtures.steptimer import device_step_metrics
from pytest_distperf.records import INFO, INFORMATIONAL, PEAK, REGRESSED, RankStep, Verdict
from pytest_distperf.verdict.explain import explain

MiB = 2**20
#: Hand-built in the layout ``torch.cuda.memory._snapshot()`` returns (tests/data/README.md).
SNAPSHOT = Path(__file__).parent / "data" / "cuda_memory_snapshot.json"
VENV = "/opt/venv/lib/python3.11/site-packages"
FOLDERS = (f"{VENV}/torch", f"{VENV}/pytest_distperf")


def ours(filename: str) -> bool:
    """torch's and the plugin's files in the recorded snapshot's environment."""
    return under(filename, FOLDERS)


def snapshot() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SNAPSHOT.read_text())
    return data


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def test_the_sites_at_the_peak_of_a_recorded_step() -> None:
    """The step starts with 13 MiB held (parameters, optimizer state, a block kept from the
    step before), peaks at 20 MiB after two blocks of model.py:88 (via nn.Linear), one
    freed block of model.py:90 and a backward block with no Python frame; the optimizer's
    block comes after the peak."""
    assert sites_at_peak(snapshot(), 0, ours) == (
        (BEFORE, 13 * MiB), ("model.py:88:forward", 5 * MiB), (NO_FRAME, 2 * MiB))
    # the first frame outside torch and the plugin names it; without the folders, torch's
    assert sites_at_peak(snapshot(), 0)[1] == ("linear.py:134:forward", 5 * MiB)
    assert sites_at_peak(snapshot(), 0, ours, top=1) == ((BEFORE, 13 * MiB),)
    assert sites_at_peak(snapshot(), 1, ours) == ()  # no such device in it
    assert sites_at_peak({"segments": [], "device_traces": []}, 0) == ()


def test_a_block_stops_counting_when_its_free_is_requested() -> None:
    """As torch's allocated bytes do: its memory may wait for another stream before it is
    reused, but it no longer counts towards the peak; a frame only in torch names the site
    by its innermost frame."""
    user = frame("/home/ci/gpt/train.py", 12, "step")
    adam = frame(f"{VENV}/torch/optim/adamw.py", 520, "_multi_tensor_adamw")
    trace = [{"action": "alloc", "addr": 100, "size": 4 * MiB, "frames": [user]},
             {"action": "free_requested", "addr": 100, "size": 4 * MiB},
             {"action": "alloc", "addr": 200, "size": 3 * MiB, "frames": [adam]},
             {"action": "free_completed", "addr": 100, "size": 4 * MiB},
             {"action": "segment_free", "addr": 0, "size": 20 * MiB}]
    data = {"segments": [], "device_traces": [trace]}
    assert sites_at_peak(data, 0, ours) == (("train.py:12:step", 4 * MiB),)
    trace[1]["action"] = "free_completed"  # its free not yet requested: both live at once
    assert sites_at_peak(data, 0, ours) == (("train.py:12:step", 4 * MiB),
                                            ("adamw.py:520:_multi_tensor_adamw", 3 * MiB))


@pytest.mark.parametrize(("before", "after", "expected"), [
    ([("a", 5), ("b", 3)], [("a", 5), ("b", 3)], []),
    ([("a", 5), ("b", 3)], [("a", 9), ("b", 4)], [("a", 5, 9), ("b", 3, 4)]),
    ([("a", 5), ("b", 3)], [("b", 9), ("a", 4)], [("b", 3, 9)]),
    ([("a", 5)], [("a", 5), ("c", 2)], [("c", None, 2)]),
])
def test_what_grew_between_two_site_lists(before: list[tuple[str, int]],
                                          after: list[tuple[str, int]],
                                          expected: list[tuple[str, int | None, int]]) -> None:
    assert grew(before, after) == expected


# -- the rank's recording ---------------------------------------------------------------------
def test_recording_gives_no_sites_where_the_allocator_cannot_tell(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU nothing is recorded; on a GPU a history or snapshot call that fails gives no
    sites, with no error, and the history is switched off again; the body's own error is
    the body's."""
    import torch

    from pytest_distperf.rank.memory import recording_peak_sites

    with recording_peak_sites(types.SimpleNamespace(on_cuda=False)) as sites:  # type: ignore[arg-type]
        pass
    assert sites == []
    calls: list[Any] = []

    def history(enabled: Any, **kw: Any) -> None:
        calls.append(enabled)
        if fail == "history" and enabled is not None:
            raise RuntimeError("not supported")

    def snap() -> dict[str, Any]:
        if fail == "snapshot":
            raise RuntimeError("snapshot failed")
        return {"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 1, "size": MiB,
             "frames": [frame("/home/ci/gpt/model.py", 7, "forward")]}]]}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", snap)
    gpu: Any = types.SimpleNamespace(on_cuda=True, device=torch.device("cuda", 0))
    for fail, expected in (("", [("model.py:7:forward", MiB)]), ("history", []),
                           ("snapshot", [])):
        calls.clear()
        with recording_peak_sites(gpu) as sites:
            pass
        assert sites == expected
        assert calls == (["all"] if fail == "history" else ["all", None])
    fail = ""
    with pytest.raises(ValueError, match="the step's"), recording_peak_sites(gpu):
        raise ValueError("the step's own error")
    assert calls[-1] is None


# -- the metrics and the explanation ----------------------------------------------------------
def gpu_rank(rank: int, peak: int, sites: tuple[tuple[str, int], ...]) -> RankStep:
    steps = (0.01,) * 5
    return RankStep(rank=rank, batch_size=8, forward_s=steps, backward_s=steps,
                    optimizer_s=steps, step_s=steps, no_sync_step_s=steps,
                    peak_memory_bytes=peak, memory_source="cuda_max_allocated",
                    memory_capacity_bytes=80 * 2**30, device=f"cuda:{rank}",
                    peak_sites=sites)


def test_the_step_timer_keeps_the_sites_of_the_rank_with_the_highest_peak() -> None:
    timing = analyze_steps([gpu_rank(0, 18 * MiB, (("model.py:88:forward", 5 * MiB),)),
                            gpu_rank(1, 20 * MiB, ((BEFORE, 13 * MiB),
                                                   ("model.py:88:forward", 7 * MiB)))])
    metrics = {m.name: m for m in device_step_metrics(timing, "x.")}
    assert metrics["x.peak_memory_bytes"].value == 20 * MiB
    assert metrics["x.peak_memory_bytes"].kind == PEAK
    sites = {n: m for n, m in metrics.items() if ".at." in n}
    assert {n: m.value for n, m in sites.items()} == {
        f"x.peak_memory_bytes.at.{BEFORE}": 13 * MiB,
        "x.peak_memory_bytes.at.model.py:88:forward": 7 * MiB}
    assert {m.kind for m in sites.values()} == {INFORMATIONAL}
    cpu = dataclasses.replace(timing, per_rank=[
        dataclasses.replace(r, memory_source="rss") for r in timing.per_rank])
    assert not [m for m in device_step_metrics(cpu) if "peak_memory" in m.name]


def site(name: str, baseline: float | None, current: float) -> Verdict:
    return Verdict(f"peak_memory_bytes.at.{name}", INFO, unit="B", baseline=baseline,
                   current=current, kind=INFORMATIONAL)


def test_a_peak_that_grew_names_the_sites_that_grew() -> None:
    peak = Verdict("peak_memory_bytes", REGRESSED, unit="B", baseline=20 * MiB,
                   current=30 * MiB, change=0.5, kind=PEAK)
    others = [site(BEFORE, 13 * MiB, 13 * MiB), site("model.py:88:forward", 5 * MiB, 12 * MiB),
              site("model.py:120:forward", 0.0, 3 * MiB), site(NO_FRAME, 2 * MiB, 2 * MiB)]

    def explained(*verdicts: Verdict) -> str:
        labels = dict.fromkeys([v.metric for v in verdicts], "step")
        return explain(list(verdicts), labels, 0.1)[0].explanation

    assert explained(peak, *others) == (
        "grew at the peak: model.py:88 in forward +7 MiB (5 MiB -> 12 MiB), "
        "model.py:120 in forward 3 MiB (not among the largest at the save)")
    # a baseline saved before the sites were recorded: nothing to compare them with
    assert explained(peak, *[dataclasses.replace(v, baseline=None) for v in others]) == ""
    # a peak that did not grow names no site
    shrunk = dataclasses.replace(peak, current=19 * MiB)
    assert "grew" not in explained(shrunk, *others)


def test_installed_packages_are_the_users_code_torch_and_the_standard_library_are_not(
        ) -> None:
    """Where the standard library's folder holds site-packages (pyenv, conda, most images),
    a model from an installed package (transformers, ...) is still named by its own line."""
    import os
    import sysconfig

    from pytest_distperf.rank import memory

    paths = sysconfig.get_paths()
    torch_folder = os.path.join(paths["purelib"], "torch")
    skip = memory.library_file(torch_folder)
    assert skip(os.path.join(torch_folder, "nn", "modules", "linear.py"))
    assert skip(os.path.join(paths["stdlib"], "contextlib.py"))
    assert not skip(os.path.join(paths["purelib"], "transformers", "modeling_gpt2.py"))
    assert not skip("/home/ci/gpt/model.py")
    assert skip(memory.__file__)
