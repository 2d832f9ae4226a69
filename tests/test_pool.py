"""The plugin and its rank pool, end to end: real pytest runs with real gloo rank processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_cases import start_held_run, wait_gone
from quick_runs import NO_DYNAMO

from pytest_distperf.fixtures.group import DistGroup
from pytest_distperf.pool import launcher
from pytest_distperf.pool.launcher import RankError, RankPool, RankTimeout, is_secondary

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

BASE = ("-p", "no:cacheprovider", "--distperf", "--gpus", "2")

HELPER_MODULE = '''
def triple(x):
    return 3 * x
'''

# One generated test module exercises most of the pool's behaviour in one pytest run, so the
# pool is spawned once (and respawned once, after the hang) rather than once per check.
POOL_TESTS = r'''
import json, os, time
import pytest
import torch
import torch.distributed as dist
from helpers_nearby import triple

OUT = os.environ["DISTPERF_TEST_OUT"]

def rank_and_sum(scale):
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t[0].item() * scale

def test_results_in_rank_order(nccl_group):
    assert nccl_group.world_size == 2 and nccl_group.backend == "gloo"
    assert nccl_group.device_type == "cpu"
    assert nccl_group.run(rank_and_sum, 10) == [(0, 2, 30.0), (1, 2, 30.0)]

def test_lambda_and_closure(nccl_group):
    offset = 100
    def closure(k, *, extra):
        return dist.get_rank() + offset + k + extra
    assert nccl_group.run(lambda: dist.get_rank() * 7) == [0, 7]
    assert nccl_group.run(closure, 1, extra=2) == [103, 104]

def test_helper_imported_next_to_the_test(nccl_group):
    assert nccl_group.run(lambda: triple(dist.get_rank() + 1)) == [3, 6]

def test_rank_output_is_forwarded(nccl_group):
    nccl_group.run(lambda: print(f"hello from rank {dist.get_rank()}", flush=True))

def _when_rank_0_waits(then):
    """Rank 0 enters an all-reduce; rank 1 waits until it has, then does ``then()``."""
    flag = os.path.join(OUT, f"waiting-{then.__name__}")
    if dist.get_rank() == 0:
        open(flag, "w").close()
        dist.all_reduce(torch.ones(1))
        return "finished"
    deadline = time.monotonic() + 30
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # rank 0 is in the all-reduce now
    then()

def test_raising_rank(nccl_group):
    def fails_on_one():
        raise KeyError("only rank one is broken")
    nccl_group.run(_when_rank_0_waits, fails_on_one)

def test_pool_still_works_after_a_raise(nccl_group):
    assert nccl_group.run(rank_and_sum, 1)[1] == (1, 2, 3.0)

class Unreadable:
    """Pickles on the rank; rebuilding it in the controller raises."""
    def __reduce__(self):
        return (_refuse, ())

def _refuse():
    raise ValueError("not here")

def test_a_result_the_controller_cannot_read(nccl_group):
    nccl_group.run(Unreadable)

def test_a_rank_dies_while_the_other_waits_for_it(nccl_group):
    def dies():
        os._exit(3)
    nccl_group.run(_when_rank_0_waits, dies)  # rank 0 loses its peer in the all-reduce

THREADS = []

def test_a_call_that_changes_the_rank_process(nccl_group):
    def meddle():
        before = torch.get_num_threads()
        os.chdir("/")
        os.environ["DISTPERF_MEDDLED"] = "1"
        torch.set_num_threads(before + 5)
        return before, os.getcwd(), torch.get_num_threads() - before
    before, cwd, more = nccl_group.run(meddle)[0]
    THREADS.append(before)
    assert (cwd, more) == ("/", 5)

def test_the_next_call_gets_the_rank_process_as_it_was(nccl_group):
    def state():
        return os.getcwd() != "/", "DISTPERF_MEDDLED" in os.environ, torch.get_num_threads()
    assert nccl_group.run(state)[0] == (True, False, THREADS[0])

DESTROYED = []

def test_code_that_destroys_the_group(nccl_group):
    DESTROYED.extend(nccl_group.run(os.getpid))
    def cleanup():  # what many DDP examples end with
        dist.destroy_process_group()
        return "cleaned up"
    nccl_group.run(cleanup)

def test_the_next_test_after_a_destroy_gets_a_group(nccl_group):
    assert nccl_group.run(rank_and_sum, 1)[1] == (1, 2, 3.0)
    assert set(nccl_group.run(os.getpid)).isdisjoint(DESTROYED)  # a fresh pool

def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "Z" not in [l for l in f if l.startswith("State:")][0]
    except FileNotFoundError:
        return False

HUNG = []

def test_hanging_rank(nccl_group):
    HUNG.extend(nccl_group.run(os.getpid))
    def hangs_on_one():
        if dist.get_rank() == 1:
            time.sleep(600)
        return "done"
    nccl_group.run(hangs_on_one)

def test_next_test_gets_a_working_group(nccl_group):
    assert len(HUNG) == 2 and not any(_alive(p) for p in HUNG)  # the hung pool is gone
    assert nccl_group.run(rank_and_sum, 2) == [(0, 2, 6.0), (1, 2, 6.0)]
    assert set(nccl_group.run(os.getpid)).isdisjoint(HUNG)  # a fresh pool

@pytest.mark.distperf(world_size=1)
def test_subgroup_of_one(nccl_group):
    assert nccl_group.world_size == 1
    def info():
        t = torch.ones(1)
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), t.item()
    assert nccl_group.run(info) == [(0, 1, 1.0)]

@pytest.mark.distperf(world_size=1, max_imbalance=0.5)
class TestMarkersMerge:
    @pytest.mark.distperf(max_imbalance=0.7)
    def test_closest_keyword_wins(self, nccl_group, request):
        from pytest_distperf.plugin import marker_settings
        assert marker_settings(request.node) == {"world_size": 1, "max_imbalance": 0.7}
        assert nccl_group.world_size == 1

def test_full_group_after_subgroup(nccl_group):
    assert [r[1] for r in nccl_group.run(rank_and_sum, 1)] == [2, 2]

@pytest.mark.distperf(world_size=3)
def test_subgroup_too_large(nccl_group):
    pass

@pytest.mark.distperf(world_sise=1)
def test_unknown_marker_keyword(nccl_group):
    pass

def test_listeners_and_pids(nccl_group):
    pids = nccl_group.run(os.getpid)
    with open(os.path.join(OUT, "pids.json"), "w") as f:
        json.dump({"controller": os.getpid(), "ranks": pids}, f)
'''


#: What gloo says on a rank whose peer went away (torch 2.13), and errors of a rank's own.
LOST_PEER = ("rank 0 raised RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
             "tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5541. This is typically "
             "caused by a remote worker crashing. Check the logs of the remote worker before "
             "reporting an error. GLHF!\nTraceback (most recent call last):")
OWN_ERROR = ("rank 1 raised KeyError: 'only rank one is broken'\nTraceback (most recent call "
             "last):\n  File \"test_x.py\", line 3, in f\n    print('Connection closed by peer')")


def test_is_secondary() -> None:
    assert is_secondary(LOST_PEER)
    assert is_secondary("rank 1 raised RuntimeError: [pair.cc:589] Read error [127.0.0.1]:"
                        "5: Connection reset by peer")
    assert is_secondary("rank 0 raised DistBackendError: NCCL communicator was aborted on "
                        "rank 0.")
    assert not is_secondary(OWN_ERROR)  # the marker below the first line does not count
    assert not is_secondary("rank 1 died (exit code 3) during run(f)")
    assert not is_secondary("")


def _report(failures: dict[int, str], stuck: list[int],
            monkeypatch: pytest.MonkeyPatch) -> RankError:
    """What RankPool._fail raises for these failures (no ranks: the stuck ones are
    described by a stand-in)."""
    pool = RankPool(3, "gloo")
    monkeypatch.setattr(pool, "_describe_stuck",
                        lambda rank: f"rank {rank} was busy with: run(f)")
    with pytest.raises(RankError) as info:
        pool._fail("run(f)", failures, stuck, "[rank 1] printed", 3.2, 60.0)
    return info.value


@pytest.mark.parametrize(("cores", "ranks", "expected"), [
    ([0, 1], 2, [(0,), (1,)]),
    ([0, 1, 2, 3, 4, 5, 6, 7], 3, [(0, 4), (1, 5), (2, 6)]),  # two cores left over
    ([2, 3, 6, 7], 2, [(2, 6), (3, 7)]),  # the cores this process may use, not 0..n
    ([0, 1, 2, 3, 4, 5, 6, 7], 8, [(0,), (4,), (1,), (5,), (2,), (6,), (3,), (7,)]),
    ([0, 1], 4, None),  # more ranks than cores: the scheduler shares them out
])
def test_each_rank_gets_its_own_cores(monkeypatch: pytest.MonkeyPatch, cores: list[int],
                                      ranks: int, expected: object) -> None:
    # a 4-core CPU with two hardware threads per core, numbered as Linux does: cpu c and
    # cpu c + 4 are the two threads of core c
    monkeypatch.setattr(launcher, "host_cores", lambda: cores)
    monkeypatch.setattr(launcher, "_topology_order", lambda cpu: (0, cpu % 4, cpu))
    assert launcher.rank_cores(ranks, "cpu") == expected
    assert launcher.rank_cores(ranks, "cuda") is None  # a GPU rank's threads stay near it
    if expected is not None:
        assert all(len(c) == launcher.threads_per_rank(ranks) for c in expected)


def test_a_pool_of_gpu_ranks_is_told_each_ranks_device_and_keeps_it() -> None:
    """The pool's side of a placement (no rank starts): gloo ranks on devices are GPU ranks."""
    assert RankPool(2, "gloo").device_type == "cpu"
    shared = RankPool(2, "gloo", devices=(0, 0))
    assert (shared.backend, shared.device_type, shared.devices) == ("gloo", "cuda", (0, 0))
    sibling = shared.sibling()
    assert (sibling.backend, sibling.devices) == ("gloo", (0, 0))
    with pytest.raises(ValueError, match="devices: one per rank, got 1 for 2"):
        RankPool(2, "nccl", devices=(0,))


class _GlooOnGpus:
    """An engine's description of gloo ranks on GPUs; no call may reach ranks through it."""

    world_size, backend, device_type, mode = 2, "gloo", "cuda", "spawned"

    def execute(self, *args: object, **kwargs: object) -> list[object]:
        raise AssertionError("the refusal comes before any call on the ranks")


@pytest.mark.parametrize(("call", "what"), [
    (lambda g: g.bench("send_recv"), "bench('send_recv')"),
    (lambda g: g.bench_pairs(), "bench_pairs()"),
])
def test_gloo_ranks_on_gpus_refuse_send_and_recv_before_any_rank_runs(
        call: Callable[[DistGroup], object], what: str) -> None:
    with pytest.raises(ValueError) as info:
        call(DistGroup(_GlooOnGpus()))  # type: ignore[arg-type]
    assert str(info.value) == (
        f"{what}: gloo cannot send or receive GPU tensors (only its collectives take them), "
        f"and these ranks run gloo on the GPU (--distperf-backend gloo-cuda); run it with "
        f"--distperf-backend nccl, or gloo for CPU ranks")


def test_a_rank_placed_on_a_gpu_puts_its_work_there_whatever_its_backend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """rank_device() follows the placement, not the backend: a gloo rank placed on cuda:1
    times and builds on cuda:1 (torch's set_device recorded, as no GPU is here)."""
    import torch

    from pytest_distperf.rank import clock

    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(clock, "_PLACED", {})
    clock.use_device(1)
    assert chosen == [1]
    assert clock.rank_device() == torch.device("cuda", 1)
    assert clock.Clock().on_cuda


@pytest.mark.skipif(len(launcher.host_cores()) < 2 or not hasattr(os, "sched_setaffinity"),
                    reason="binding ranks needs a core per rank")
@pytest.mark.parametrize("bind", [True, False])
def test_ranks_bound_to_their_own_cores(bind: bool) -> None:
    """Real ranks: bound (``--distperf-bind``), each runs on its own core, and the fresh
    pools of a re-measurement are bound the same; unbound (the default), each may run on
    every core."""
    pool = RankPool(2, "gloo", timeout_s=60, bind=bind)
    fresh = pool.sibling()
    try:
        pool.start()
        fresh.start()
        everything = launcher.host_cores()
        for started in (pool, fresh):
            got = started.execute(lambda: sorted(os.sched_getaffinity(0)), (), {}, 2,
                                  "run(affinity)")
            info = started.rank_info()
            assert [i["cores"] for i in info] == [len(everything)] * 2
            if bind:
                assert got == [[c] for c in everything[:2]], got
                assert [i["bound_cores"] for i in info] == [1, 1]
            else:
                assert got == [everything, everything], got
                assert [i["bound_cores"] for i in info] == [0, 0]
    finally:
        pool.close()
        fresh.close()


def _order(text: str, *parts: str) -> list[int]:
    return [text.index(part) for part in parts]


def test_the_root_cause_is_listed_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # rank 1 raised while rank 0 waited for it in a collective: rank 0 never finished
    text = str(_report({1: OWN_ERROR}, [0], monkeypatch))
    assert text.startswith("rank 1 raised KeyError: 'only rank one is broken'"), text
    order = _order(text, "rank 1 raised", "rank(s) 0 did not finish after another rank "
                   "failed (waited 3.2 s)", "rank 0 was busy with", "[rank 1] printed",
                   "(the rank pool was killed")
    assert order == sorted(order), text
    # the peer's lost connection came in first; rank 1's death is still the root cause
    error = _report({0: LOST_PEER, 1: "rank 1 died (exit code 3) during run(f)"}, [],
                    monkeypatch)
    assert str(error).startswith("rank 1 died (exit code 3)"), str(error)
    assert error.failed_ranks == (0, 1) and type(error) is RankError
    # the first rank to fail comes first: rank 2 died, then rank 0 raised on its own;
    # rank 1 got stuck and is listed before the errors of lost peers
    text = str(_report({2: "rank 2 died (exit code -9) during run(f)",
                        0: "rank 0 raised ValueError: bad input\nTraceback",
                        1: LOST_PEER.replace("rank 0", "rank 1")}, [], monkeypatch))
    order = _order(text, "rank 2 died", "rank 0 raised ValueError", "rank 1 raised Runtime")
    assert order == sorted(order), text
    text = str(_report({2: "rank 2 died (exit code -9) during run(f)", 0: LOST_PEER}, [1],
                       monkeypatch))
    order = _order(text, "rank 2 died", "rank(s) 1 did not finish", "rank 1 was busy with",
                   "rank 0 raised RuntimeError")
    assert order == sorted(order), text


def test_the_profilers_notices_are_not_forwarded(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_distperf.pool.ranklogs import RankLogs

    logs = RankLogs(str(tmp_path), 2)
    (tmp_path / "rank0.log").write_text(
        "USDT:2026-11-26 23:12:04 7341:7341 SyncActivityProfilerHandler.cpp:52] "
        "profiler_start\nthe user's line\n"
        "STAGE:2026-11-26 23:12:19 7485:7485 SyncActivityProfilerHandler.cpp:51] Completed "
        "Stage: Warm Up\n"
        "WARNING:2026-11-26 23:12:19 7485:7485 init.cpp:1] kept: a warning says something\n")
    (tmp_path / "rank1.log").write_text(
        "USDT:2026-11-26 23:12:04 7342:7342 SyncActivityProfilerHandler.cpp:59] "
        "profiler_stop\n")
    tail = logs.take([0, 1])
    assert capsys.readouterr().out == (
        "[rank 0] the user's line\n[rank 0] WARNING:2026-11-26 23:12:19 7485:7485 "
        "init.cpp:1] kept: a warning says something\n")  # rank 1 printed nothing else
    assert "USDT" not in tail and "STAGE" not in tail and "the user's line" in tail


def test_a_timeout_alone_is_a_rank_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _report({}, [0, 1], monkeypatch)
    assert type(error) is RankTimeout and error.failed_ranks == (0, 1)
    assert str(error).startswith("run(f): rank(s) 0, 1 did not finish within the timeout of "
                                 "60 s (waited 3.2 s)")


def _listening_sockets(pids: list[int]) -> list[str]:
    """Local addresses of the TCP listeners owned by ``pids`` (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    found.append(local)
    return found


def _is_loopback(hex_addr: str) -> bool:
    host = hex_addr.split(":", maxsplit=1)[0]
    if len(host) == 8:  # IPv4, little-endian hex
        return host.endswith("7F")  # 127.x.x.x
    return host in ("00000000000000000000000001000000",) or host.endswith("0100007F")


@pytest.fixture
def pool_run(pytester: pytest.Pytester, tmp_path: Path) -> tuple[pytest.RunResult, Path]:
    """One pytest run of POOL_TESTS with real rank processes (shared by several checks)."""
    pytester.makepyfile(helpers_nearby=HELPER_MODULE, test_pool_behaviour=POOL_TESTS)
    os.environ["DISTPERF_TEST_OUT"] = str(tmp_path)
    try:
        # the hang is over after 4 s; every other call here takes milliseconds
        result = pytester.runpytest(*BASE, "--distperf-timeout", "4", "-rA")
    finally:
        del os.environ["DISTPERF_TEST_OUT"]
    return result, tmp_path


def test_pool_behaviour(pool_run: tuple[pytest.RunResult, Path]) -> None:
    result, out = pool_run
    result.assert_outcomes(passed=13, failed=5, errors=2)
    result.stdout.fnmatch_lines([
        "distperf: 2 ranks, backend gloo, device cpu*, torch *, pool: spawned on first use*",
    ])
    assert "bound" not in result.stdout.str()  # unless --distperf-bind (test_config.py)
    text = result.stdout.str()
    # a rank raises while the other waits for it in a collective: the root cause first (the
    # rank number and its traceback, pointing at the user's line), then the rank that got
    # stuck, with its stack
    raised = text.split("_ test_raising_rank _")[1]
    assert "RankError: rank 1 raised KeyError: 'only rank one is broken'" in raised
    assert 'raise KeyError("only rank one is broken")' in raised
    rank_traceback = raised.split("rank 1 raised KeyError")[1].split("did not finish")[0]
    assert "fails_on_one" in rank_traceback and "worker.py" not in rank_traceback
    order = [raised.index(part) for part in (
        "rank 1 raised KeyError", "run(_when_rank_0_waits): rank(s) 0 did not finish after "
        "another rank failed", "rank 0 was busy with: run(_when_rank_0_waits)", "in all_reduce")]
    assert order == sorted(order), raised
    # a hang: the rank that did not finish, what it was doing, its Python stack
    result.stdout.fnmatch_lines([
        "*run(test_hanging_rank.<locals>.hangs_on_one): rank(s) 1 did not finish within the "
        "timeout of 4 s*",
        "*rank 1 was busy with: run(test_hanging_rank.<locals>.hangs_on_one)*",
        "*in hangs_on_one*",
        "*the rank pool was killed; the next call starts a fresh one*",
    ])
    # a rank dies while the other waits for it: the death first, then gloo's error on the
    # rank that lost it as a peer
    died = text.split("_ test_a_rank_dies_while_the_other_waits_for_it _")[1]
    assert "RankError: rank 1 died (exit code 3) during run(_when_rank_0_waits)" in died
    lost = died.index("rank 0 raised RuntimeError: [")
    assert died.index("rank 1 died (exit code 3)") < lost
    assert "Connection closed by peer" in died[lost:].split("\n", 1)[0]
    # a result that cannot be unpickled here fails at once (not after the timeout), saying so
    result.stdout.fnmatch_lines([
        "*rank 0 raised its result could not be unpickled in the controller (ValueError: not "
        "here)*"])
    assert "test_a_result_the_controller_cannot_read): rank(s)" not in text  # no hang
    # code that destroys the process group fails its test clearly; the next test has a group
    result.stdout.fnmatch_lines([
        "*rank 0 raised RuntimeError: the process group was destroyed on rank 0 "
        "(dist.destroy_process_group() in "
        "the code this test ran*"])
    result.stdout.fnmatch_lines(["PASSED *::test_the_next_test_after_a_destroy_gets_a_group"])
    # what a rank prints is forwarded to the test's output, prefixed with the rank
    result.stdout.fnmatch_lines(["*[[]rank 1[]] hello from rank 1*"])
    # a subgroup larger than the pool, and a misspelt marker keyword
    result.stdout.fnmatch_lines([
        "*world_size=3) is larger than the 2 ranks of this run; run with --gpus 3 or more*",
        "*unknown keyword 'world_sise'; valid keywords: world_size, max_comm_overhead*",
    ])
    for name in ("test_results_in_rank_order", "test_lambda_and_closure",
                 "test_helper_imported_next_to_the_test", "test_pool_still_works_after_a_raise",
                 "test_next_test_gets_a_working_group", "test_subgroup_of_one",
                 "test_full_group_after_subgroup", "test_listeners_and_pids",
                 "TestMarkersMerge::test_closest_keyword_wins"):
        result.stdout.fnmatch_lines([f"PASSED *::{name}"])
    # no rank process outlives a normal run
    pids = json.loads((out / "pids.json").read_text())
    assert len(pids["ranks"]) == 2
    assert wait_gone(pids["ranks"]) == []


def test_every_listening_socket_is_on_loopback(pytester: pytest.Pytester,
                                               tmp_path: Path) -> None:
    proc, pids = start_held_run(pytester, tmp_path, hold=60)
    try:
        all_pids = [int(pids["controller"]), *pids["ranks"]]  # type: ignore[call-overload]
        listeners = _listening_sockets(all_pids)
        assert listeners, "the group should have listening sockets (store, gloo pairs)"
        assert [a for a in listeners if not _is_loopback(a)] == []
    finally:
        proc.kill()
        proc.wait()
    assert wait_gone(pids["ranks"]) == []  # type: ignore[arg-type]


SKIP_TESTS = r'''
import pytest

def test_uses_group(nccl_group):
    raise AssertionError("must not run without --distperf")

@pytest.mark.distperf
def test_marked_only():
    raise AssertionError("must not run without --distperf")

def test_plain():
    import sys
    assert "torch" not in sys.modules  # the plugin loads without importing torch
'''


def test_skipped_without_distperf(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_skips=SKIP_TESTS)
    # a new process: whether the plugin imports torch shows only where torch is not loaded
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "distperf: disabled*use --distperf*",
        "SKIPPED*run with --distperf to enable it*",
    ])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "0"), "ERROR: --gpus: the world size must be at least 1, got 0 (from --gpus "
                          "on the command line)"),
        (("--gpus", "four"), "ERROR: --gpus: expected a whole number of ranks >= 1, got 'four'*"),
        (("--distperf-backend", "mpi"), "ERROR: --distperf-backend: expected one of auto, nccl, "
                                        "gloo, gloo-cuda, got 'mpi'*"),
        (("--distperf-backend", "gloo-cuda"), "ERROR: --distperf-backend gloo-cuda: no CUDA "
                                              "device is visible*"),
        (("--distperf-timeout", "-3"), "ERROR: --distperf-timeout: expected a positive*"),
        (("--distperf-backend", "nccl"), "ERROR: --distperf-backend nccl: *"),
        (("--distperf-env-name", "my runner"), "ERROR: --distperf-env-name: expected a name of "
                                               "*got 'my runner'*(from --distperf-env-name on "
                                               "the command line)"),
    ],
)
def test_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    pytester.makepyfile(test_nothing="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's torch tells of one usable GPU (the in-process runs share it): how a
    GPU machine looks to the plugin when it places the ranks, which is all that is run."""
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)


def test_too_few_gpus_is_a_usage_error_not_cpu_ranks(pytester: pytest.Pytester,
                                                      one_gpu: None) -> None:
    pytester.makepyfile(test_nothing="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf", "--gpus", "4",
                                "--distperf-backend", "auto")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --gpus 4 needs 4 GPUs (one per rank) but 1 is visible; with GPUs visible, "
        "--distperf-backend auto does not fall back to CPU ranks; use --gpus 1 to run on the "
        "GPUs, or --distperf-backend gloo to run 4 ranks on the CPU on purpose, or "
        "--distperf-backend gloo-cuda to run them on the GPU with gloo"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    # gloo asked for: CPU ranks, and the header says that a GPU is there
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf", "--gpus", "4",
                                "--distperf-backend", "gloo", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["distperf: 4 ranks, backend gloo, device cpu (*; 1 CUDA "
                                 "devices visible)*"])


@pytest.fixture
def nccl_version(monkeypatch: pytest.MonkeyPatch) -> Callable[[tuple[int, ...]], None]:
    """Make this process's torch tell of NCCL ``version`` (with :func:`one_gpu`)."""
    import torch

    def set_version(version: tuple[int, ...]) -> None:
        monkeypatch.setattr(torch.cuda.nccl, "version", lambda: version)

    return set_version


def test_gloo_cuda_on_one_gpu_says_in_the_header_what_its_figures_are(
        pytester: pytest.Pytester, one_gpu: None) -> None:
    """Only the placement and the header run (--collect-only): no rank starts, on no GPU."""
    pytester.makepyfile(test_nothing="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf", "--distperf-backend",
                                "gloo-cuda", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "distperf: 2 ranks, backend gloo, device cuda (2 ranks per GPU on device 0 of 1 "
        "visible), torch *",
        "distperf: gloo ranks with their tensors on the GPU: gloo copies GPU tensors through "
        "host memory: its communication figures (bench's busbw, a step's communication) are "
        "gloo's, not NVLink's or PCIe's",
        "distperf: 2 ranks share a GPU: they share its SMs and memory, so their times are not "
        "those of a rank per GPU; their baselines are kept apart (2pergpu in the key)"])


def test_nccl_ranks_share_a_gpu_only_where_asked_and_nccl_allows_it(
        pytester: pytest.Pytester, one_gpu: None, monkeypatch: pytest.MonkeyPatch,
        nccl_version: Callable[[tuple[int, ...]], None]) -> None:
    pytester.makepyfile(test_nothing="def test_x():\n    pass\n")
    # the quick runs' options ask for gloo (tests/quick_runs.py): ask for NCCL
    args = ("-p", "no:cacheprovider", "--distperf", "--distperf-backend", "nccl", "--gpus", "2",
            "--collect-only")
    nccl_version((2, 30, 1))
    result = pytester.runpytest(*args)  # not asked for: one rank per GPU, as before
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --distperf-backend nccl needs 2 GPUs (one per rank) "
                                 "but 1 is visible; *, or NCCL_MULTI_RANK_GPU_ENABLE=1 to put "
                                 "up to 2 NCCL ranks on a GPU (experimental), or *"])
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "distperf: 2 ranks, backend nccl, device cuda (2 ranks per GPU on device 0 of 1 "
        "visible), torch *",
        "distperf: 2 ranks share a GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL 2.30.1, "
        "experimental): they share its SMs and memory, *"])
    result = pytester.runpytest(*args[:-2], "3", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: NCCL_MULTI_RANK_GPU_ENABLE=1: 3 ranks on 1 GPU would put 3 on one, and NCCL "
        "2.30.1 lets at most 2 share a GPU; use --gpus 2 or fewer, or --distperf-backend "
        "gloo-cuda to run 3 gloo ranks on the GPU"])
    nccl_version((2, 28, 3))
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: NCCL_MULTI_RANK_GPU_ENABLE=1: several ranks per GPU need NCCL 2.30 or later, "
        "and this torch has NCCL 2.28.3; use --distperf-backend gloo-cuda to run 2 gloo ranks "
        "on the GPU (their collectives go through host memory), or a torch built with NCCL "
        "2.30 or later"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_usage_error_from_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndistperf_gpus = many\n")
    pytester.makepyfile(test_nothing="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpus: *got 'many' (from distperf_gpus in *tox.ini)"])


TORCHRUN_TESTS = r'''
import os
import pytest
import torch
import torch.distributed as dist

def test_run_gathers_from_every_rank(nccl_group):
    assert nccl_group.world_size == 2
    assert nccl_group.run(lambda x: (dist.get_rank(), x), "a") == [(0, "a"), (1, "a")]

@pytest.mark.distperf(world_size=1)
def test_subgroup_under_torchrun(nccl_group):
    assert nccl_group.run(lambda: dist.get_world_size()) == [1]

def test_rank_error_reaches_every_rank(nccl_group):
    from pytest_distperf import RankError
    def bad():
        if dist.get_rank() == 1:
            raise ValueError("rank one says no")
    with pytest.raises(RankError, match="rank 1 raised ValueError: rank one says no"):
        nccl_group.run(bad)

def test_out_of_memory_says_its_cause_first(nccl_group):
    from pytest_distperf import RankError
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    with pytest.raises(RankError, match=r"\Arank 0 raised OutOfMemoryError on cpu: asked for "
                                        r"2\.00 GiB; free and peak memory unknown"):
        nccl_group.run(oom)

def test_measure_records_on_rank_zero_only(nccl_group):
    nccl_group.measure("tiny", lambda: None, iters=3)

THREADS = []

def test_a_call_that_changes_the_rank_process(nccl_group):
    def meddle():
        THREADS.append(torch.get_num_threads())
        os.chdir("/")
        os.environ["DISTPERF_MEDDLED"] = "1"
        torch.set_num_threads(THREADS[0] + 5)
        return os.getcwd()
    assert nccl_group.run(meddle) == ["/", "/"]

def test_the_next_call_gets_the_rank_process_as_it_was(nccl_group):
    def state():
        return os.getcwd() != "/", "DISTPERF_MEDDLED" in os.environ, torch.get_num_threads()
    assert nccl_group.run(state) == [(True, False, THREADS[0])] * 2

# the last tests of the file: nothing runs on the group after them
def test_code_that_destroys_the_group(nccl_group):
    def cleanup():  # what many DDP examples end with
        dist.destroy_process_group()
    nccl_group.run(cleanup)

def test_every_later_call_fails_at_once(nccl_group):
    nccl_group.run(os.getpid)
'''


def test_torchrun_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_under_torchrun=TORCHRUN_TESTS)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run(
        [*torchrun, "--standalone", "--nproc-per-node", "2", "--tee", "3",
         "-m", "pytest", "-p", "no:cacheprovider", "--distperf", "-rA"],
        check=False, cwd=pytester.path, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert output.count("2 failed, 7 passed") == 2, output  # both ranks ran the whole file
    # what a call changed in the process (the rank's pytest itself) was put back after it
    assert output.count("PASSED test_under_torchrun.py::test_the_next_call_gets_the_rank_"
                        "process_as_it_was") == 2, output
    # code that destroys torchrun's group fails its test, saying so; later calls fail at once
    # with the reason (not "Default process group has not been initialized", not a hang)
    for rank in (0, 1):
        assert (f"RankError: RuntimeError: the process group was destroyed on rank {rank} "
                "(dist.destroy_process_group() in the code this test ran") in output, output
    # once per rank, in its traceback (with $CI set the short summary repeats it)
    assert len([line for line in output.splitlines() if "]:E " in line and
                "RankError: run(getpid) was not run: an earlier call broke the group of this "
                "rank: RuntimeError: the process group was destroyed" in line]) == 2, output
    assert "has not been initialized" not in output, output
    assert output.count("distperf: 2 ranks, backend gloo") == 2
    assert "pool: torchrun's group (this is rank 0 of 2)" in output
    assert "pool: torchrun's group (this is rank 1 of 2)" in output
    # only rank 0 prints the summary
    assert output.count("distperf summary") == 1, output


XDIST_TESTS = r'''
import os
import torch.distributed as dist

def _report(nccl_group, name):
    pids = nccl_group.run(os.getpid)
    with open(os.path.join(os.environ["DISTPERF_TEST_OUT"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + " ".join(map(str, pids)))

def _fork_servers_started_by(pid):
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as f:
                command = f.read()
        except OSError:
            continue
        if parent == pid and "forkserver" in command:
            found.append(int(entry))
    return found

def test_a(nccl_group):
    _report(nccl_group, "a")
    assert nccl_group.run(lambda: dist.get_world_size()) == [2, 2]
    # the controller runs no test: it started no fork server for ranks; this worker did
    assert _fork_servers_started_by(os.getppid()) == []
    assert len(_fork_servers_started_by(os.getpid())) == 1

def test_b(nccl_group):
    _report(nccl_group, "b")

def test_c(nccl_group):
    _report(nccl_group, "c")

def test_d(nccl_group):
    _report(nccl_group, "d")
'''


def test_xdist_spreads_tests_over_two_pools(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_xdist=XDIST_TESTS)
    os.environ["DISTPERF_TEST_OUT"] = str(tmp_path)
    try:
        # xdist: its workers do not find the pytester plugins from an in-process run
        result = pytester.runpytest_subprocess(*BASE, *NO_DYNAMO, "-n", "2", "--dist", "load")
    finally:
        del os.environ["DISTPERF_TEST_OUT"]
    result.assert_outcomes(passed=4)
    pools: dict[str, set[str]] = {}
    for name in "abcd":
        worker, *pids = (tmp_path / name).read_text().split()
        pools.setdefault(worker, set()).update(pids)
    # both workers ran tests, each on its own pool of 2 ranks, and no two share a rank
    assert len(pools) == 2
    assert all(len(pids) == 2 for pids in pools.values())
    all_pids = [p for pids in pools.values() for p in pids]
    assert len(all_pids) == len(set(all_pids))
