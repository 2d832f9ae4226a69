"""A GPU step that slowed while the device's work did not (verdict/hostside.py).

The cases are the comparisons issue 47 recorded on one NVIDIA H200 (a GPT-2-small-class
model under DDP, bf16 autocast): an unchanged test whose step read +6.8% with the device
busy 0.80 of it (0.95 at the save), beside the changes that were caught (two more blocks, an
extra all-reduce, a ``.item()`` per step, autocast dropped), each verdict as the plugin
gives it, the device figures as that run's counted step gave them."""

from __future__ import annotations

import pytest

from pytest_distperf.records import INCONCLUSIVE, INFO, REGRESSED, UNCHANGED, Verdict
from pytest_distperf.verdict.hostside import host_side

LABEL = "ddp_step_timer(ddp, 1 ranks)"


def measurement(step: float, device: float, busy: tuple[float, float], *,
                launches: tuple[float, float] = (1130, 1130),
                syncs: tuple[float, float] = (0, 0), host: float | None = 0.0,
                prefix: str = "", suffix: str = "") -> list[Verdict]:
    """A GPU step's verdicts: the step ``step`` slower (regressed), its compute as much,
    the kernels' time ``device`` slower, the busy share (save, now), the launches and syncs
    per step (save, now), the host-speed control ``host`` slower (None: not measured)."""
    def name(stem: str) -> str:
        return f"{prefix}{stem}{suffix}"

    def exact(stem: str, was: float, now: float) -> Verdict:
        return Verdict(name(stem), UNCHANGED if was == now else REGRESSED, baseline=was,
                       current=now, change=(now - was) / was if was else None, kind="exact")

    out = [Verdict(name("step_time_s"), REGRESSED, baseline=0.0232,
                   current=0.0232 * (1 + step), change=step, detail="regressed: ..."),
           Verdict(name("compute_time_s"), REGRESSED, baseline=0.0220,
                   current=0.0220 * (1 + step), change=step, detail="regressed: ..."),
           Verdict(name("device_time_s"), INFO, baseline=0.0220, current=0.0220 * (1 + device),
                   change=device, kind="informational"),
           Verdict(name("device_busy"), INFO, baseline=busy[0], current=busy[1],
                   change=(busy[1] - busy[0]) / busy[0], unit="fraction",
                   higher_is_better=True, kind="informational"),
           exact("device.launches", *launches), exact("device.syncs", *syncs)]
    if host is not None:
        out.append(Verdict(name("host_control_s"), INFO, baseline=0.003,
                           current=0.003 * (1 + host), change=host, kind="informational"))
    return out


def judged(verdicts: list[Verdict]) -> dict[str, Verdict]:
    labels = {v.metric: LABEL for v in verdicts}
    return {v.metric: v for v in host_side(verdicts, labels)}


@pytest.mark.parametrize("host", [0.15, 0.068, None])
def test_a_host_hiccup_is_inconclusive(host: float | None) -> None:
    """The recorded false alarm: +6.8%, the same kernels, the device busy 0.95 -> 0.80, on
    a host that ran slower (or with nothing to tell): a noisy host, not the step."""
    v = judged(measurement(0.068, 0.002, (0.95, 0.80), host=host))
    for name in ("step_time_s", "compute_time_s"):
        assert v[name].verdict == INCONCLUSIVE
        assert v[name].detail.startswith("inconclusive: +6.8%, all of it on the host's side")
        assert "the device busy 0.95 -> 0.80" in v[name].detail
        assert v[name].detail.endswith("judged alone: regressed: ...")
    said = ("no host-speed control to tell" if host is None
            else f"the host-speed control +{host:.1%}")
    assert said in v["step_time_s"].detail


def test_a_step_whose_host_work_grew_stays_regressed_and_says_so() -> None:
    """The same figures on a host as fast as at the save: the step's own host work grew."""
    v = judged(measurement(0.068, 0.002, (0.95, 0.80), host=0.01))
    assert v["step_time_s"].verdict == REGRESSED
    assert v["step_time_s"].detail.startswith("regressed: ...; host side: the device's kernel "
                                              "time +0.2%")
    assert "the host-speed control +1.0%: the step's own host work grew" in (
        v["step_time_s"].detail)


@pytest.mark.parametrize(("what", "verdicts"), [
    # two more blocks: +12.3%, more kernels, the device as busy
    ("larger", measurement(0.123, 0.125, (0.95, 0.95), launches=(1130, 1310), host=0.2)),
    # a .item() per step: a host sync more, the device idle while the host waits
    ("item", measurement(0.06, 0.0, (0.95, 0.85), syncs=(0, 1), host=0.2)),
    # autocast dropped: the kernels' time +560%
    ("fp32", measurement(5.6, 5.9, (0.95, 0.98), host=0.2)),
    # an extra all-reduce: one more launch per step
    ("extra collective", measurement(0.05, 0.01, (0.95, 0.90), launches=(1130, 1131),
                                     host=0.2)),
    # the kernels' time grew by more than half the step's change (device-side, a slower GPU)
    ("device", measurement(0.12, 0.07, (0.95, 0.90), host=0.2)),
])
def test_a_change_the_device_saw_stays_regressed(what: str, verdicts: list[Verdict]) -> None:
    v = judged(verdicts)
    assert v["step_time_s"].verdict == REGRESSED, what
    assert v["step_time_s"].detail == "regressed: ...", what


def test_without_device_figures_nothing_changes() -> None:
    """A CPU step (no device figures), or a baseline saved before them."""
    cpu = [v for v in measurement(0.3, 0.0, (0.95, 0.8)) if v.metric in (
        "step_time_s", "compute_time_s")]
    assert host_side(cpu, {v.metric: LABEL for v in cpu}) == cpu


def test_each_step_is_judged_by_its_own_measurement() -> None:
    """Two models in one test (name="a", a second call's #2): each step by its own figures,
    matched by prefix, ``#n`` and measurement."""
    hiccup = measurement(0.1, 0.0, (0.95, 0.8), host=0.2, prefix="a.", suffix="#2")
    real = measurement(0.1, 0.0, (0.95, 0.8), launches=(10, 12), host=0.2, prefix="a.")
    labels = {**{v.metric: "second" for v in hiccup}, **{v.metric: "first" for v in real}}
    v = {x.metric: x for x in host_side(real + hiccup, labels)}
    assert v["a.step_time_s#2"].verdict == INCONCLUSIVE
    assert v["a.step_time_s"].verdict == REGRESSED


def gpu_step(slower: float, host: float, launches: int = 1130) -> list:
    """A GPU step's metrics as ``ddp_step_timer`` records them: the step and compute times
    ``slower`` times the save's, the kernels' time as at the save (22 ms), so the busy share
    falls; the host-speed control ``host`` times the save's."""
    from test_exact import exact, timed

    from pytest_distperf.records import INFORMATIONAL, Metric

    step = timed("step_time_s", slower)
    return [step, timed("compute_time_s", slower),
            Metric("device_time_s", 0.022, "s", False, kind=INFORMATIONAL),
            Metric("device_busy", 0.022 / step.value, "fraction", True, kind=INFORMATIONAL),
            exact("device.launches", launches), exact("device.syncs", 0),
            Metric("host_control_s", 0.003 * host, "s", False,
                   tuple(0.003 * host * (1 + 0.001 * i) for i in range(6)),
                   kind=INFORMATIONAL)]


@pytest.mark.parametrize(("host", "launches", "verdict"), [
    (1.3, 1130, INCONCLUSIVE), (1.0, 1130, REGRESSED), (1.3, 1131, REGRESSED)])
def test_through_the_judgement(tmp_path, host: float, launches: int, verdict: str) -> None:
    """Saved, then compared 30% slower on the host's side: inconclusive on a host 30%
    slower, regressed (saying it is the host's side) on one as fast; regressed as ever with
    a launch more."""
    from test_exact import saved, verdicts_of

    file = saved(tmp_path, gpu_step(1.0, 1.0))
    v = verdicts_of(file, gpu_step(1.3, host, launches))
    assert v["step_time_s"].verdict == verdict
    assert ("the device busy" in v["step_time_s"].detail) == (launches == 1130)
