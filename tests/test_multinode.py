"""Multi-node on one machine: torchrun agents started as separate processes, the way separate
machines start them, run a distperf suite as one job on gloo.

* Two agents (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on loopback), each in its
  own folder like a checkout on each machine: every rank passes the suite, only global rank
  0 writes the JSON report and the baselines, the ranks know their node, and the pair
  matrix is recorded as intra-node and inter-node figures.
* Two "nodes" in their own network namespaces joined by a veth pair (iproute2, as root), 2
  ranks each, one side's sends rate-limited (``tc``): the job runs as one, the pair matrix
  reports intra- and inter-node figures, and the analyzer names the slow link and says that
  with two nodes it cannot pin it on one of them (a pair's round trip crosses both nodes,
  docs/cluster.md).
* Three "nodes" in their own network namespaces on a bridge, one of them with two ranks and
  a slowed network (``tc``: a rate limit, or a netem delay where the kernel has netem).  The
  analyzer names that node and its ranks.

Every agent is bounded in time; its process tree (torchrun starts the ranks in sessions of
their own) is killed in a ``finally``, and the namespaces are deleted by the fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from quick_runs import ONE_SAVE, quick_env

#: The longest one multi-node run may take before its agents are killed.
AGENT_TIMEOUT_S = 180

#: The suite every rank runs.  DISTPERF_TEST_AGENT names the agent (the "machine") a rank was
#: started by; DISTPERF_TEST_SLOW, where set, the agent whose network is slowed.
SUITE = r'''
import os

import pytest
import torch
from torch import nn

from pytest_distperf.analysis.topology import node_names

# 4 CPU ranks on 2 cores: this suite checks the multi-node plumbing, not the speed
pytestmark = pytest.mark.distperf(max_comm_overhead=2.0, max_imbalance=100.0)
ALL = os.environ.get("DISTPERF_TEST_ALL") == "1"


def agents(nccl_group):
    return nccl_group.run(lambda: os.environ["DISTPERF_TEST_AGENT"])


def test_ranks_know_their_node(nccl_group):
    nodes = node_names(nccl_group.engine.rank_info())
    started_by = agents(nccl_group)
    n = nccl_group.world_size
    for a in range(n):
        for b in range(n):
            assert (nodes[a] == nodes[b]) == (started_by[a] == started_by[b]), (nodes, started_by)
    assert len(set(nodes)) == int(os.environ["GROUP_WORLD_SIZE"])
    assert nodes[int(os.environ["RANK"])] == f"node {os.environ['GROUP_RANK']} ({os.uname()[1]})"


@pytest.mark.skipif(not ALL, reason="the short suite")
def test_all_reduce(nccl_group):
    result = nccl_group.bench("all_reduce", ["64KiB"], warmup=1, iters=3)
    assert result.wrong == 0 and result.world_size == 4


@pytest.mark.skipif(not ALL, reason="the short suite")
def test_ddp_step(ddp_step_timer):
    timing = ddp_step_timer(lambda: nn.Linear(32, 32), lambda rank: torch.randn(8, 32),
                            steps=3, warmup=1)
    assert len(timing.per_rank) == 4


def test_pairs_by_node(nccl_group):
    matrix = nccl_group.bench_pairs("64KiB", warmup=1, iters=int(os.environ["PAIR_ITERS"]))
    split = matrix.by_node  # bench_pairs sees that the ranks span nodes
    assert split is not None and split.inter_gbps > 0
    slow = os.environ.get("DISTPERF_TEST_SLOW")
    if os.environ.get("DISTPERF_TEST_TWO_NODES") and slow:
        (finding,) = split.bottlenecks
        assert finding.kind == "slow_link" and not split.slow_nodes, split.bottlenecks
        assert "with two nodes this cannot be pinned on one of them" in finding.description
        assert sorted(finding.ranks) == [0, 1, 2, 3], finding
    elif slow:
        started_by = agents(nccl_group)
        ranks = tuple(r for r, a in enumerate(started_by) if a == slow)
        assert split.slow_nodes, split
        assert split.slow_nodes[0].ranks == ranks, (split.slow_nodes, started_by)
        finding = split.bottlenecks[0]
        assert finding.kind == "slow_node" and finding.ranks == ranks, finding
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(nnodes: int, nproc: int, endpoint: str, run_id: str, *extra: str,
             save: bool = False) -> list[str]:
    """One agent's command line: it runs the suite with a JSON report (and saves baselines
    with ``save``, one measurement of each timing: where they are written is the point)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            endpoint, "--rdzv-id", run_id, "--tee", "3", *extra,
            "-m", "pytest", "-p", "no:cacheprovider", "--distperf",
            *(["--distperf-save", *ONE_SAVE, "--distperf-save-measurements", "1"] if save
              else []),
            "--distperf-json", "report.json", "-rA"]


def checkout(root: Path, name: str) -> Path:
    """A folder with the suite, as each machine would have its own checkout."""
    folder = root / name
    folder.mkdir()
    (folder / "test_suite.py").write_text(SUITE)
    return folder


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill an agent and its ranks (each rank leads a session of its own)."""
    tree = descendants(proc.pid)
    for pid in tree:
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def run_agents(commands: list[tuple[list[str], Path, dict[str, str]]]) -> list[str]:
    """Start every agent at once and wait for all; their outputs (stdout and stderr) in
    order.  Agents still running after AGENT_TIMEOUT_S, or when anything fails, are killed
    with their ranks."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for argv, cwd, env in commands:
            log = (cwd / "agent.log").open("wb")
            logs.append(log)
            procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + AGENT_TIMEOUT_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            kill_tree(proc)
        for log in logs:
            log.close()
    outputs = [(cwd / "agent.log").read_text(errors="replace") for _, cwd, _ in commands]
    for proc, text, (_, cwd, _) in zip(procs, outputs, commands, strict=True):
        assert proc.returncode == 0, f"agent in {cwd} ended with {proc.returncode}:\n{text}"
    return outputs


def agent_env(name: str, **extra: str) -> dict[str, str]:
    return quick_env(**{"OMP_NUM_THREADS": "1", "DISTPERF_TEST_AGENT": name, "PAIR_ITERS": "4",
                        **extra})


def reports(folders: list[Path]) -> list[Path]:
    return [f for f in folders if (f / "report.json").exists()]


def test_two_torchrun_agents_run_one_four_rank_job(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    folders = [checkout(tmp_path, name) for name in ("machine-a", "machine-b")]
    run_id = uuid.uuid4().hex[:8]
    outputs = run_agents([(torchrun(2, 2, endpoint, run_id, save=True), folder,
                           agent_env(folder.name, DISTPERF_TEST_ALL="1"))
                          for folder in folders])
    for output in outputs:  # both local ranks of each agent passed the whole suite
        for local in (0, 1):
            assert any(line.startswith(f"[default{local}]:") and "4 passed" in line
                       for line in output.splitlines()), output
    # only global rank 0 wrote files: the report and the baselines, in its machine's folder
    (home,) = reports(folders)
    assert [f for f in folders if (f / "perf_baselines").exists()] == [home]
    ranks_there = outputs[folders.index(home)]
    assert "pool: torchrun's group (this is rank 0 of 4)" in ranks_there
    data = json.loads((home / "report.json").read_text())
    (pairs,) = [t for t in data["tests"] if t["nodeid"].endswith("test_pairs_by_node")]
    metrics = {m["name"]: m["value"] for m in pairs["metrics"]}
    assert metrics["pairs.64KiB.intra_node_busbw_gbps"] > 0
    assert metrics["pairs.64KiB.inter_node_busbw_gbps"] > 0
    (matrix,) = [r["result"] for r in pairs["results"] if r["kind"] == "PairMatrix"]
    split = matrix["by_node"]
    assert sorted(set(split["nodes"])) == [f"node 0 ({socket.gethostname()})",
                                           f"node 1 ({socket.gethostname()})"]
    assert {(k["src"] != k["dst"], k["pairs"]) for k in split["links"]} == {(False, 2),
                                                                           (True, 4)}


# -- three nodes in network namespaces ---------------------------------------------------------
SUBNET = "10.213.7"
#: How each fault is put on the slow node's interface, and what the kernel must have for it.
FAULTS = {
    "rate": ["tbf", "rate", "4mbit", "burst", "4kb", "latency", "200ms"],
    "delay": ["netem", "delay", "50ms"],
}


def sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


class Network:
    """"Nodes", each a network namespace with interface ``dp0`` (10.213.7.1, .2, ...): on a
    bridge in one more namespace, or (``bridged=False``, two nodes) the two ends of one veth
    pair; names unique to this run."""

    def __init__(self, nodes: int, bridged: bool = True) -> None:
        self.bridged = bridged
        self.tag = f"dp{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.tag}sw"
        self.nodes = [f"{self.tag}n{i}" for i in range(nodes)]
        self.made: list[str] = []

    def add(self, name: str) -> None:
        done = sh("ip", "netns", "add", name)
        if done.returncode != 0:
            raise PermissionError(f"ip netns add {name}: {done.stderr.strip()}")
        self.made.append(name)

    def build(self) -> None:
        if not self.bridged:
            self._build_pair()
            return
        steps = []
        self.add(self.switch)
        steps.append(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        steps.append(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, ns in enumerate(self.nodes):
            self.add(ns)
            veth, port = f"{self.tag}v{i}", f"{self.tag}p{i}"
            steps += [
                ["ip", "link", "add", veth, "type", "veth", "peer", "name", port],
                ["ip", "link", "set", veth, "netns", ns],
                ["ip", "link", "set", port, "netns", self.switch],
                ["ip", "-n", ns, "link", "set", veth, "name", "dp0"],
                ["ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "dp0"],
                ["ip", "-n", ns, "link", "set", "dp0", "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
                ["ip", "-n", self.switch, "link", "set", port, "master", "br0"],
                ["ip", "-n", self.switch, "link", "set", port, "up"],
            ]
        for argv in steps:
            done = sh(*argv)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"

    def _build_pair(self) -> None:
        for ns in self.nodes:
            self.add(ns)
        a, b = self.nodes
        steps = [["ip", "link", "add", f"{self.tag}a", "type", "veth", "peer", "name",
                  f"{self.tag}b"],
                 ["ip", "link", "set", f"{self.tag}a", "netns", a],
                 ["ip", "link", "set", f"{self.tag}b", "netns", b]]
        for i, (ns, end) in enumerate(((a, f"{self.tag}a"), (b, f"{self.tag}b"))):
            steps += [["ip", "-n", ns, "link", "set", end, "name", "dp0"],
                      ["ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "dp0"],
                      ["ip", "-n", ns, "link", "set", "dp0", "up"],
                      ["ip", "-n", ns, "link", "set", "lo", "up"]]
        for argv in steps:
            done = sh(*argv)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"

    def teardown(self) -> None:
        for name in reversed(self.made):  # deleting a namespace deletes its interfaces
            sh("ip", "netns", "del", name)

    def command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run in node i's namespace, with a host name of its own."""
        inner = " ".join(f"'{a}'" for a in argv)
        return ["ip", "netns", "exec", self.nodes[i], "unshare", "--uts", "sh", "-c",
                f"hostname {self.tag}-node{i} && exec {inner}"]


def make_network(nodes: int, bridged: bool) -> Iterator[Network]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    missing = [tool for tool in ("ip", "tc", "unshare", "hostname") if not shutil.which(tool)]
    if missing:
        pytest.skip(f"needs iproute2 and util-linux: {', '.join(missing)} not found")
    net = Network(nodes, bridged)
    try:
        try:
            net.build()
        except PermissionError as exc:
            pytest.skip(f"cannot create network namespaces here ({exc})")
        yield net
    finally:
        net.teardown()


@pytest.fixture
def network() -> Iterator[Network]:
    yield from make_network(3, bridged=True)


@pytest.fixture
def pair_network() -> Iterator[Network]:
    yield from make_network(2, bridged=False)


def run_slowed(net: Network, ranks: list[int], slow: int, fault: str, tmp_path: Path,
               **env: str) -> tuple[str, dict[str, Any]]:
    """The suite on ``net``'s nodes (``ranks[i]`` ranks on node i) with node ``slow``'s
    network slowed by ``fault``: the output of the node that wrote the report, and the pair
    matrix in it.  Skipped where the kernel has no such qdisc."""
    done = sh("ip", "netns", "exec", net.nodes[slow], "tc", "qdisc", "add", "dev", "dp0",
              "root", *FAULTS[fault])
    if done.returncode != 0:
        pytest.skip(f"tc qdisc {FAULTS[fault][0]} is not available here: "
                    f"{done.stderr.strip()}")
    folders = [checkout(tmp_path, f"node{i}") for i in range(len(ranks))]
    commands = []
    for i, folder in enumerate(folders):
        argv = torchrun(len(ranks), ranks[i], f"{SUBNET}.1:29400", net.tag, "--rdzv-conf",
                        f"is_host={int(i == 0)}", "--local-addr", f"{SUBNET}.{i + 1}")
        extra = {"DISTPERF_TEST_SLOW": folders[slow].name, "GLOO_SOCKET_IFNAME": "dp0",
                 "PAIR_ITERS": "8", **env}
        commands.append((net.command(i, argv), folder, agent_env(folder.name, **extra)))
    outputs = run_agents(commands)
    for output, n in zip(outputs, ranks, strict=True):
        for local in range(n):
            assert any(line.startswith(f"[default{local}]:") and "2 passed" in line
                       for line in output.splitlines()), output
    (home,) = reports(folders)
    data = json.loads((home / "report.json").read_text())
    (pairs,) = [t for t in data["tests"] if t["nodeid"].endswith("test_pairs_by_node")]
    (matrix,) = [r["result"] for r in pairs["results"] if r["kind"] == "PairMatrix"]
    return outputs[folders.index(home)], matrix


def test_two_nodes_on_a_veth_pair_run_one_job(pair_network: Network, tmp_path: Path) -> None:
    """Two namespaces joined by one veth pair, 2 ranks each, node 1's sends limited: one
    4-rank job; the pair matrix has intra- and inter-node figures; the slow link is named,
    with why it cannot be pinned on one of two nodes."""
    _, matrix = run_slowed(pair_network, [2, 2], 1, "rate", tmp_path,
                           DISTPERF_TEST_TWO_NODES="1")
    split = matrix["by_node"]
    assert split["intra_gbps"] > 0 and split["inter_gbps"] > 0
    (link,) = split["bottlenecks"]
    assert link["kind"] == "slow_link"
    assert link["description"].startswith(f"the link from node 1 ({pair_network.tag}-node")


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_three_nodes_the_analyzer_names_the_slow_node(network: Network, fault: str,
                                                      tmp_path: Path) -> None:
    slow = 2  # node 2 runs two ranks and has the slow network
    summary, matrix = run_slowed(network, [1, 1, 2], slow, fault, tmp_path)
    worst = matrix["by_node"]["bottlenecks"][0]
    assert worst["kind"] == "slow_node"
    assert worst["description"].startswith("node ") and f"{network.tag}-node{slow})" in \
        worst["description"].split(" is slow")[0]
    assert "finding: slow_node (" in summary
