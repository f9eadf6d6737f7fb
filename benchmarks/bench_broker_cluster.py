"""The clustered broker tier against one mosquitto: reports per second end to end and broker CPU per report.

The same N sealed envelopes go, in the same run, through a round over each broker:

* **mosquitto**: one process (``shuffledp.deploy.broker.Broker``: TLS, passwords, ACL, the
  per-role limits plugin) -- the baseline;
* **NATS, 3 nodes, 3 replicas**: ``shuffledp.deploy.nats_cluster.NatsCluster`` as the parties
  use it (each QoS 1 publish stored in a JetStream stream replicated to every node, so a
  node can be killed mid-round: ``tests/mqtt/test_nats_cluster.py``);
* **NATS, 3 nodes, 1 replica**: the same cluster with unreplicated streams (does not survive
  the loss of the node holding a stream): what the replication costs.

Each round is ``bench_mqtt_load.over_mqtt``: ``PUBLISHERS`` processes publish the envelopes
(QoS 1) on their own connections, the shuffler service (SQLite spool) admits, receipts and
releases them, the coordinator opens and acknowledges; every party connects to node 0 with
the other nodes as failover. Reported per broker: reports per second from the first envelope
published to the last report opened, and the broker's CPU seconds (user + system, of every
node, from /proc) over the round per 1,000 reports, with the ratio to mosquitto's. The
publishers, the brokers and the parties share the machine's cores (the JSON records how many).

Run: ``python benchmarks/bench_broker_cluster.py [N] [--quick] [--out DIR]`` (default N =
20,000; ``--quick``: 100 reports, 2 publishers given 0.5 s instead of 2 s to start and connect
before the clock starts, so a quick run's rates may include their start-up); writes
broker_cluster.json into the output folder (default ``bench-out/``). Needs mosquitto and nats-server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from _common import arguments, parse, write_result
from bench_mqtt_load import HEAD_START, QUICK_HEAD_START, load_round, over_mqtt, seal_all

from shuffledp.deploy.broker import Broker, default_role_limits
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.nats_cluster import NatsCluster
from shuffledp.progress import progress_bar
from shuffledp.protocol.wire.messages import RoundSpec

PUBLISHERS = int(os.environ.get("SHUFFLEDP_BENCH_PUBLISHERS", "4"))
QUICK = {"n": 100, "publishers": 2}
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (fields 14 and 15 of /proc/PID/stat)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def broker_pids(broker: Broker | NatsCluster) -> list[int]:
    if isinstance(broker, NatsCluster):
        return [pid for pid in (broker.pid(i) for i in range(broker.nodes)) if pid is not None]
    assert broker.pid is not None
    return [broker.pid]


def run_round(broker: Broker | NatsCluster, deployment: Deployment, spec: RoundSpec, envelopes: list[bytes],
              spool: Path, publishers: int, head_start: float = HEAD_START) -> dict:
    pids = broker_pids(broker)
    before = cpu_seconds(pids)
    record, seconds, admitted = asyncio.run(over_mqtt(broker, deployment, spec, envelopes, spool, publishers,
                                                      head_start=head_start))
    cpu = cpu_seconds(pids) - before
    n = len(envelopes)
    return {"reports_per_s": n / seconds, "seconds": seconds, "broker_cpu_s": cpu,
            "broker_cpu_ms_per_1000_reports": 1e6 * cpu / n, "lost": n - admitted, "opened": record.opened.size,
            "broker_processes": len(pids)}


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, quick=f"{QUICK['n']} reports, {QUICK['publishers']} publishers, a "
                                      f"{QUICK_HEAD_START:g} s head start (a smoke run)")
    parser.add_argument("n", nargs="?", type=int, default=20_000, help="reports in the round (default 20,000)")
    parser.add_argument("--publishers", type=int, default=PUBLISHERS, help="publishing processes (default %(default)s)")
    args = parse(parser, argv)
    sizes = dict(QUICK) if args.quick else {"n": args.n, "publishers": args.publishers}
    n, publishers = sizes["n"], sizes["publishers"]
    head_start = QUICK_HEAD_START if args.quick else HEAD_START
    deployment, spec = load_round(n)
    brokers: dict[str, dict] = {}
    with progress_bar(4, unit="step") as step:
        step("sealing (the devices' work)", 0)
        envelopes, _ = seal_all(deployment, spec, n)
        with tempfile.TemporaryDirectory() as work:
            base = Path(work)
            step("mosquitto", 1)
            limits = default_role_limits()  # every publishing process is one connection of the client account
            limits["client"] = dataclasses.replace(limits["client"], max_connections=publishers)
            with Broker(base / "mosquitto", role_limits=limits) as broker:
                brokers["mosquitto"] = run_round(broker, deployment, spec, envelopes, base / "m.db", publishers,
                                                 head_start)
            for replicas in (3, 1):
                step(f"NATS, 3 nodes, {replicas} replica(s)", 1)
                with NatsCluster(base / f"nats-r{replicas}", nodes=3, replicas=replicas) as cluster:
                    brokers[f"nats_3_nodes_r{replicas}"] = run_round(cluster, deployment, spec, envelopes,
                                                                     base / f"n{replicas}.db", publishers, head_start)
    baseline = brokers["mosquitto"]
    for row in brokers.values():
        row["rate_vs_mosquitto"] = row["reports_per_s"] / baseline["reports_per_s"]
        row["cpu_per_report_vs_mosquitto"] = row["broker_cpu_s"] / baseline["broker_cpu_s"] if baseline["broker_cpu_s"] else None
    result = {"n": n, "publishers": publishers, "cpus": os.cpu_count(), "envelope_bytes": len(envelopes[0]),
              "brokers": brokers}
    path = write_result(args, "broker_cluster", result, sizes=sizes)
    print(f"broker tier: {n:,} reports, {publishers} publishing processes, {result['cpus']} CPUs, same run")
    print(f"  {'broker':<26}{'reports/s':>10}{'x mosq.':>9}{'broker CPU ms/1000':>20}{'x mosq.':>9}{'lost':>6}")
    for name, row in brokers.items():
        ratio = row["cpu_per_report_vs_mosquitto"]
        print(f"  {name:<26}{row['reports_per_s']:>10,.0f}{row['rate_vs_mosquitto']:>9.2f}"
              f"{row['broker_cpu_ms_per_1000_reports']:>20,.0f}{(f'{ratio:.1f}' if ratio else '-'):>9}{row['lost']:>6}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
