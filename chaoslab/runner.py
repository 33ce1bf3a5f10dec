"""Running a plan: the cluster, a FaultProxy per node, the client in its own process.

``Lab``: a 3-node :class:`~pipeline.testing.kafka.KafkaCluster` whose nodes advertise the
ports of the FaultProxies this module runs in front of them, so every connection of the
client under test crosses a proxy; admin calls and the judge's reader use the INTERNAL
listeners and never do.

:func:`run_schedule` runs one plan with one client:

1. a fresh topic (6 partitions, RF=3, ``min.insync.replicas=2``);
2. the worker (``python -m chaoslab.worker``) starts, delivers message 0 and says ``ready``;
3. the plan's two lanes run from that moment (see :mod:`chaoslab.plan`);
4. heal: every proxy fault cleared, every node running; the worker is told ``heal`` and
   keeps sending for ``plan.tail`` seconds, then ``stop``: it closes and reports (with
   ``plan.close_under_stall``, while every node is blackholed);
5. the log is read back and judged (:mod:`chaoslab.judge`; a transactional plan's by
   :mod:`chaoslab.txn_judge`, with a ``read_committed`` reader).

A transactional plan's client gets a transactional id of its own (``chaos-<topic>``);
the steps aimed at its coordinator look the coordinator up when they run.

Every wait is bounded; the worker is killed if it outlives its close bound by a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from chaoslab.coordinator import TXN_STATE_TOPIC, coordinator_node, txn_state_partition
from chaoslab.judge import Verdict, check, judge, read_log
from chaoslab.plan import NODES, Plan, Step
from chaoslab.txn_judge import TxnVerdict, check_txn, judge_txn, read_records, wait_stable
from chaoslab.worker import NON_IDEMPOTENT
from pipeline.protocol.api import ApiKey
from pipeline.testing.kafka import KafkaCluster
from pipeline.testing.proxy import FaultProxy

REPO_ROOT = Path(__file__).resolve().parents[1]
# After the heal, the first message sent must be acknowledged within this bound.
RECOVER_BOUND = 10.0
# close must return within close_timeout + request_timeout (the producer's documented
# bound: an idempotent request already on the wire gets up to request_timeout for its
# answer, franz-go #930) plus this slack for scheduling on a busy machine.
CLOSE_SLACK = 1.0


def close_bound(plan: Plan) -> float:
    return plan.close_timeout + plan.request_timeout + CLOSE_SLACK
READY_TIMEOUT = 90.0
WORKER_GRACE = 60.0  # beyond the close bound, before the worker is killed
FAULTS_TIMEOUT = 300.0  # both lanes of a plan, restarts included (normally 15-40 s)


@dataclass
class Lab:
    cluster: KafkaCluster
    proxies: dict[int, FaultProxy]
    events: list[str] = field(default_factory=list)
    t0: float = 0.0
    # conn-kills windows open per proxy (node id): overlapping windows end with the last.
    kill_windows: dict[int, int] = field(default_factory=dict)
    # The transactional id of the run's client (transactional plans), else None.
    transactional_id: str | None = None

    def note(self, text: str) -> None:
        line = f"t+{trio.current_time() - self.t0:6.1f}s  {text}"
        self.events.append(line)

    def selected(self, node: int | None) -> list[int]:
        return list(self.proxies) if node is None else [node]

    def clear_network(self) -> None:
        self.kill_windows.clear()
        for proxy in self.proxies.values():
            proxy.clear_faults()
            proxy.stop_random_kills()

    async def heal(self) -> None:
        self.clear_network()
        started = await self.cluster.call(self.cluster.start_all)
        if started:
            self.note(f"heal: restarted node(s) {started}")


@contextlib.asynccontextmanager
async def open_lab(cluster: KafkaCluster) -> AsyncIterator[Lab]:
    """FaultProxies on ``cluster``'s advertised ports (the cluster must have been started
    with ``advertised_ports``), running until the block ends."""
    if cluster.advertised_ports is None:
        raise ValueError("the cluster needs advertised_ports (one FaultProxy port per node)")
    async with trio.open_nursery() as nursery:
        proxies = {}
        for n in cluster.nodes:
            proxy = FaultProxy(*cluster.proxy_upstream(n),
                               listen_port=cluster.advertised_ports[n], seed=n)
            await nursery.start(proxy.run)
            proxies[n] = proxy
        try:
            yield Lab(cluster, proxies)
        finally:
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- the lanes


async def _sleep_until(when: float) -> None:
    await trio.sleep_until(when)


async def _leader(lab: Lab, topic: str, partition: int) -> int:
    return await lab.cluster.call(lab.cluster.leader, topic, partition)


async def _coordinator(lab: Lab) -> int:
    if lab.transactional_id is None:
        raise ValueError("a step aimed at the transaction coordinator needs a transactional plan")
    return await coordinator_node(lab.cluster.internal_bootstrap, lab.transactional_id)


def _txn_state_partitions(cluster: KafkaCluster) -> int:
    from pipeline.testing.kafka.settings import test_kit_config

    config = {**test_kit_config(len(cluster.nodes)), **cluster.broker_config}
    return int(config["transaction.state.log.num.partitions"])


async def _cluster_step(lab: Lab, topic: str, step: Step) -> None:
    cluster = lab.cluster
    if step.action == "kill-leader":
        assert step.partition is not None
        node = await _leader(lab, topic, step.partition)
        lab.note(f"SIGKILL node {node} (leader of p{step.partition})")
        await cluster.call(cluster.kill, node)
        await trio.sleep(step.seconds)
        lab.note(f"start node {node}")
        await cluster.call(cluster.start, node)
        lab.note(f"node {node} back in every ISR")
    elif step.action == "sigterm":
        assert step.node is not None
        lab.note(f"SIGTERM node {step.node}")
        await cluster.call(cluster.stop, step.node)
        lab.note(f"node {step.node} exited")
        await trio.sleep(step.seconds)
        lab.note(f"start node {step.node}")
        await cluster.call(cluster.start, step.node)
        lab.note(f"node {step.node} back in every ISR")
    elif step.action == "move-leader":
        assert step.partition is not None
        leader = await _leader(lab, topic, step.partition)
        target = NODES[(NODES.index(leader) + step.shift) % len(NODES)]
        lab.note(f"move p{step.partition}'s leadership {leader} -> {target}")
        await cluster.call(cluster.move_leader, topic, step.partition, to_node=target)
        lab.note(f"p{step.partition} led by {target}")
    elif step.action == "kill-coordinator":
        node = await _coordinator(lab)
        lab.note(f"SIGKILL node {node} (the transaction coordinator)")
        await cluster.call(cluster.kill, node)
        await trio.sleep(step.seconds)
        lab.note(f"start node {node}")
        await cluster.call(cluster.start, node)
        lab.note(f"node {node} back in every ISR")
    elif step.action == "move-coordinator":
        assert lab.transactional_id is not None
        p = txn_state_partition(lab.transactional_id, _txn_state_partitions(cluster))
        leader = await _leader(lab, TXN_STATE_TOPIC, p)
        target = NODES[(NODES.index(leader) + step.shift) % len(NODES)]
        lab.note(f"move the coordinator ({TXN_STATE_TOPIC} p{p}) {leader} -> {target}")
        await cluster.call(cluster.move_leader, TXN_STATE_TOPIC, p, to_node=target)
        lab.note(f"coordinator now node {await _coordinator(lab)}")
    else:
        raise ValueError(f"not a cluster action: {step.action!r}")


async def cluster_lane(lab: Lab, topic: str, steps: list[Step]) -> None:
    """One step at a time: at its planned time, or once the previous one is done."""
    for step in steps:
        await _sleep_until(lab.t0 + step.at)
        try:
            await _cluster_step(lab, topic, step)
        except Exception as exc:  # an infrastructure failure: recorded, the run goes on
            lab.note(f"STEP FAILED {step.action}: {type(exc).__name__}: {exc}")
            await lab.heal()


async def network_step(lab: Lab, step: Step, rng: random.Random) -> None:
    await _sleep_until(lab.t0 + step.at)
    if step.target == "coordinator":
        node = await _coordinator(lab)
        nodes, where = [node], f"node {node} (the coordinator)"
    else:
        nodes = lab.selected(step.node)
        where = "every node" if step.node is None else f"node {step.node}"
    proxies = [lab.proxies[n] for n in nodes]
    if step.action == "conn-kills":
        assert step.lifetimes is not None
        killed0 = sum(p.stats.killed for p in proxies)
        for n in nodes:
            lab.kill_windows[n] = lab.kill_windows.get(n, 0) + 1
            lab.proxies[n].kill_randomly(*step.lifetimes)
        lab.note(f"connection kills on {where} for {step.seconds:.1f}s")
        await trio.sleep(step.seconds)
        for n in nodes:
            lab.kill_windows[n] = lab.kill_windows.get(n, 1) - 1
            if lab.kill_windows[n] <= 0:
                lab.proxies[n].stop_random_kills()
        lab.note(f"connection kills on {where} over: "
                 f"{sum(p.stats.killed for p in proxies) - killed0} closed")
    elif step.action == "kill-all":
        lab.note(f"killed {sum(p.kill_all() for p in proxies)} connection(s) of {where}")
    elif step.action == "lost-responses":
        lost0 = sum(p.stats.responses_lost for p in proxies)
        interval = step.seconds / max(step.count, 1)
        armed: dict[int, int] = {}
        for _ in range(step.count):
            n = rng.choice(nodes)
            proxy = lab.proxies[n]
            # Arm only once this proxy's previous rule fired: a pile of armed rules would
            # lose every response for as long as the client keeps retrying.
            if proxy.stats.responses_lost >= armed.get(n, proxy.stats.responses_lost):
                armed[n] = proxy.stats.responses_lost + 1
                proxy.lose_responses(1, api_key=ApiKey[step.api])
            await trio.sleep(interval)
        for proxy in proxies:
            proxy.stop_losing_responses()
        api = "Produce" if step.api == "PRODUCE" else step.api
        lab.note(f"lost {sum(p.stats.responses_lost for p in proxies) - lost0} {api} "
                 f"response(s) of {where}")
    elif step.action == "stall":
        for proxy in proxies:
            proxy.blackhole(step.seconds)
        lab.note(f"blackhole {where} for {step.seconds:.1f}s")
        await trio.sleep(step.seconds)
        lab.note(f"blackhole {where} over")
    else:
        raise ValueError(f"not a network action: {step.action!r}")


# --------------------------------------------------------------------------- the worker


def worker_command(plan: Plan, client: str, bootstrap: str, topic: str, run_id: int,
                   out: Path, transactional_id: str | None = None) -> list[str]:
    txn = ([] if transactional_id is None else
           ["--transactional-id", transactional_id, "--txn-size", str(plan.txn_size),
            "--transaction-timeout", str(plan.transaction_timeout)])
    return [
        sys.executable, "-m", "chaoslab.worker", "--client", client, "--bootstrap", bootstrap,
        "--topic", topic, "--run-id", str(run_id), "--rate", str(plan.rate),
        "--burst", str(plan.burst), "--batch-bytes", str(plan.batch_bytes),
        "--keys", str(plan.keys), "--request-timeout", str(plan.request_timeout),
        "--delivery-timeout", str(plan.delivery_timeout),
        "--close-timeout", str(plan.close_timeout), "--out", str(out), *txn,
    ]


async def _read_lines(stream: trio.abc.ReceiveStream, lines: trio.MemorySendChannel[str]
                      ) -> None:
    buf = b""
    async with lines:
        while True:
            data = await stream.receive_some(4096)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                await lines.send(line.decode(errors="replace").strip())


async def _tell(proc: trio.Process, word: str) -> bool:
    """Write a command to the worker; False if it has gone (its report says why)."""
    assert proc.stdin is not None
    try:
        await proc.stdin.send_all(word.encode() + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


def _run_files(logs_dir: Path, name: str) -> tuple[Path, Path]:
    """The worker's report (removed if an earlier run left one) and its log."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    out = logs_dir / f"{name}.json"
    out.unlink(missing_ok=True)
    return out, logs_dir / f"{name}.log"


async def run_schedule(lab: Lab, plan: Plan, client: str, *, logs_dir: Path,
                       log: Callable[[str], None] = print) -> Verdict | TxnVerdict:
    """Run ``plan`` with ``client``; return the judged verdict (violations included)."""
    cluster = lab.cluster
    started = time.monotonic()
    verdict: Verdict | TxnVerdict = (TxnVerdict(client, plan.seed, plan.family)
                                     if plan.transactional else
                                     Verdict(client, plan.seed, plan.family))
    await lab.heal()
    topic = f"chaos-s{plan.seed}-{client}-{uuid.uuid4().hex[:6]}"
    await cluster.call(cluster.create_topic, topic, plan.partitions, 3,
                       {"min.insync.replicas": "2"})
    run_id = random.Random(f"{plan.seed}-{client}").randrange(1, 10**6)
    out, stderr_path = _run_files(logs_dir, f"s{plan.seed}-{client}")
    lab.events = []
    lab.transactional_id = f"chaos-{topic}" if plan.transactional else None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]))
    bound = close_bound(plan)
    with stderr_path.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            worker_command(plan, client, cluster.proxied_bootstrap, topic, run_id, out,
                           lab.transactional_id),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO_ROOT,
            env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    lines_send, lines = trio.open_memory_channel[str](64)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_lines, proc.stdout, lines_send)
            with trio.move_on_after(READY_TIMEOUT) as waiting:
                async for line in lines:
                    if line == "ready":
                        break
                else:
                    waiting.cancel()  # the worker exited before it was ready
            if waiting.cancelled_caught:
                verdict.events.append("the worker never became ready")
                nursery.cancel_scope.cancel()
            else:
                lab.t0 = trio.current_time()
                lab.note("client ready: faults start")
                rng = random.Random(plan.seed)
                with trio.move_on_after(FAULTS_TIMEOUT) as faults:
                    async with trio.open_nursery() as lanes:
                        lanes.start_soon(cluster_lane, lab, topic,
                                         [s for s in plan.steps if s.lane == "cluster"])
                        for step in plan.steps:
                            if step.lane == "network":
                                lanes.start_soon(network_step, lab, step, rng)
                if faults.cancelled_caught:
                    lab.note(f"STEP FAILED: the faults took over {FAULTS_TIMEOUT:.0f}s; cut")
                await lab.heal()
                lab.note("healed: every node up, no proxy fault")
                if await _tell(proc, "heal"):
                    await trio.sleep(plan.tail)
                    if plan.close_under_stall:
                        for proxy in lab.proxies.values():
                            proxy.blackhole(bound + WORKER_GRACE)
                        lab.note("blackhole every node")
                        await trio.sleep(1.0)
                    lab.note("stop: the client closes")
                    await _tell(proc, "stop")
                with trio.move_on_after(bound + WORKER_GRACE):
                    await proc.wait()
                lab.note("the client exited")
                lab.clear_network()
                nursery.cancel_scope.cancel()
    finally:
        lab.clear_network()
        if proc.returncode is None:
            verdict.events.append("worker killed: it did not exit in time")
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    await stream.aclose()
    verdict.events = [*lab.events, *verdict.events]
    if isinstance(verdict, TxnVerdict):
        await _judge_txn_run(lab, plan, verdict, out, stderr_path, proc.returncode, topic,
                             run_id, bound)
        verdict.seconds = time.monotonic() - started
        log(f"  {client:<13} seed {plan.seed:>3}: " + txn_summary_line(verdict))
        return verdict
    try:
        report: dict[str, Any] = json.loads(out.read_text())
    except (OSError, ValueError):
        verdict.extra["worker_error"] = (f"no report (exit {proc.returncode}); see "
                                         f"{stderr_path}")
        verdict.stuck = -1
        check(verdict, close_bound=bound, recover_bound=RECOVER_BOUND,
              idempotent=client not in NON_IDEMPOTENT)
        verdict.violations.append("no report")
        verdict.seconds = time.monotonic() - started
        return verdict
    records = await trio.to_thread.run_sync(read_log, cluster.internal_bootstrap, topic,
                                            plan.partitions)
    judge(verdict, report, records, run_id)
    check(verdict, close_bound=bound, recover_bound=RECOVER_BOUND,
              idempotent=client not in NON_IDEMPOTENT)
    verdict.seconds = time.monotonic() - started
    await cluster.call(cluster.delete_topic, topic)
    log(f"  {client:<10} seed {plan.seed:>2}: " + summary_line(verdict))
    return verdict


async def _judge_txn_run(lab: Lab, plan: Plan, verdict: TxnVerdict, out: Path,
                         stderr_path: Path, returncode: int | None, topic: str, run_id: int,
                         bound: float) -> None:
    """Read the topic back (read_committed, and read_uncommitted for what aborts hid) and
    judge the transactional run into ``verdict``."""
    cluster = lab.cluster
    try:
        report: dict[str, Any] = json.loads(await trio.Path(out).read_text())
    except (OSError, ValueError):
        report = {"error": f"no report (exit {returncode}); see {stderr_path}"}
    bootstrap = cluster.internal_bootstrap
    # An open transaction (a client that died) holds the last stable offset back until
    # the coordinator aborts it: at most its timeout, plus the abort's own seconds.
    if not await trio.to_thread.run_sync(wait_stable, bootstrap, topic,
                                         plan.transaction_timeout + 30.0):
        verdict.extra["unstable"] = "a transaction stayed open"
    committed = await trio.to_thread.run_sync(read_records, bootstrap, topic,
                                              plan.partitions, "read_committed")
    everything = await trio.to_thread.run_sync(read_records, bootstrap, topic,
                                               plan.partitions, "read_uncommitted")
    unstable = verdict.extra.get("unstable")
    judge_txn(verdict, report, committed, everything, run_id)
    if unstable:
        verdict.extra["unstable"] = unstable
    check_txn(verdict, close_bound=bound, recover_bound=RECOVER_BOUND)
    await cluster.call(cluster.delete_topic, topic)


def txn_summary_line(v: TxnVerdict) -> str:
    close = "-" if v.close_s is None else f"{v.close_s:.1f}s"
    recover = "-" if v.recover_s is None else f"{v.recover_s:.1f}s"
    verdict = "OK" if not v.violations else "VIOLATED: " + "; ".join(v.violations)
    return (f"txns {v.attempts} committed {v.committed} aborted {v.aborted} unknown "
            f"{v.unknown} partial {v.partial} twice {v.twice} committed-missing "
            f"{v.committed_missing} aborted-visible {v.aborted_visible} reord {v.reordered} "
            f"hidden {v.written_aborted} close {close} recover {recover}  {verdict}")


def summary_line(v: Verdict) -> str:
    close = "-" if v.close_s is None else f"{v.close_s:.1f}s"
    recover = "-" if v.recover_s is None else f"{v.recover_s:.1f}s"
    verdict = "OK" if not v.violations else "VIOLATED: " + "; ".join(v.violations)
    return (f"delivered {v.delivered} failed {v.failed} lost {v.lost} dup {v.duplicated} "
            f"reord {v.reordered} stuck {v.stuck} close {close} recover {recover}  {verdict}")
