"""Rounds over a local 3-node NATS broker cluster, each with one node SIGKILLed mid-round.

Each round (:func:`tests.mqtt.cluster_kill_round.run_kill_round`: the real shuffler in a process
of its own, the analyzer's coordinator and a fleet of devices here, each party on its own node)
kills one node at a moment that alternates between ``receipts`` (reports admitted and others
outstanding, the batch not yet out) and ``unacknowledged`` (the batch opened at the analyzer,
its acknowledgement held until the node is dead), and a node that cycles through the stream
leader (with the shuffler on it), the shuffler's node and the analyzer's node. The killed node
is started again, and the cluster waited healthy, before the next round. One cluster serves
every round (each round is a session of its own).

It prints a line per round and a table: reports sent, counted by the analyzer, copies counted
twice, whether every device's ledger was charged exactly once, whether a device joining after
the kill read the round's spec, how many acknowledgements the analyzer sent again (the shuffler
published the batch again because the first was lost with the node: ``analyzer/ack_keeper.py``),
and how the round ended at the shuffler (``served``: an acknowledgement reached it; ``failed: not
acknowledged``: none did, and the shuffler gave the batch up ``ack_timeout`` seconds after the
deadline, with a signed ``failed`` outcome, although the analyzer had counted it).

    python scripts/cluster_kills.py              # 10 kills, about 3 minutes on 2 cores
                                                 # (a round that ends unserved takes about 45 s)
    python scripts/cluster_kills.py --kills 3 --users 100

Exit status 1 if any round lost or double-counted a report, charged a device other than once,
hid the spec from the late device, or ended without the batch served.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the round runner lives with the tests it is shared with
    sys.path.insert(0, str(ROOT))

from tests.mqtt.cluster_kill_round import MOMENTS, NODES, Kill, KillRoundResult, kill_cluster, run_kill_round  # noqa: E402

COLUMNS = ("round", "moment", "node killed", "sent", "counted", "duplicates", "ledgers charged once",
           "late device saw spec", "acks sent again", "round outcome", "seconds")
#: How a round ended at the shuffler (its spool), by the batch's end.
OUTCOMES = {"served": "served (acknowledged)", "expired": "failed: not acknowledged", "unsettled": "unsettled"}


def schedule(kills: int) -> list[Kill]:
    """Round ``i``'s kill: moment ``MOMENTS[i % 2]``, node ``NODES[i % 3]``, so six rounds cover every pair."""
    return [Kill(MOMENTS[i % len(MOMENTS)], NODES[i % len(NODES)]) for i in range(kills)]


def _node_label(result: KillRoundResult) -> str:
    index = result.killed
    parties = [party for party, node in sorted(result.nodes.items()) if node == index]
    if result.shuffler_at_kill == index and "shuffler" not in parties:
        parties.append("shuffler (failed over there)")
    roles = (["stream leader"] if result.killed_leader else []) + parties
    return f"{index} ({', '.join(roles) or 'no party'})"


def row(number: int, result: KillRoundResult) -> tuple[str, ...]:
    yes = {True: "yes", False: "no"}
    return (str(number), result.kill.moment, _node_label(result), str(result.sent), str(result.counted),
            str(result.duplicates), yes[result.charged_once], yes[result.late_saw_spec], str(result.reacknowledged),
            OUTCOMES[result.batch], f"{result.seconds:.1f}")


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(COLUMNS), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


async def run(kills: int, users: int, directory: Path) -> int:
    rows: list[tuple[str, ...]] = []
    failed = 0
    with kill_cluster(directory / "nats") as cluster:
        for number, kill in enumerate(schedule(kills), 1):
            try:
                result = await run_kill_round(cluster, directory / f"round-{number}", kill, users=users, seed=number)
            except Exception as exc:  # a round that did not complete is a failed round, reported as such
                failed += 1
                rows.append((str(number), kill.moment, kill.node, str(users), "-", "-", "-", "-",
                             f"error: {type(exc).__name__}", "-"))
                print(f"round {number}: {kill.moment}, {kill.node}: did not complete: {type(exc).__name__}: {exc}", flush=True)
            else:
                failed += not result.exactly_once
                rows.append(row(number, result))
                print(f"round {number}: {kill.moment}, node {_node_label(result)}: {result.counted}/{result.sent} counted, "
                      f"{result.duplicates} duplicates, {OUTCOMES[result.batch]}, {result.seconds:.1f} s", flush=True)
            for index in range(cluster.nodes):  # every node up again before the next round
                if not cluster.running(index):
                    await asyncio.to_thread(cluster.start_node, index)
            await asyncio.to_thread(cluster.wait_healthy)
    print()
    print(table(rows))
    print(f"\n{kills - failed} of {kills} rounds counted every report once, charged every device once, "
          "showed the late device the spec and served the batch")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10, help="rounds, one node killed in each (default 10)")
    parser.add_argument("--users", type=int, default=200, help="devices per round (default 200)")
    parser.add_argument("--directory", type=Path, default=None,
                        help="where the cluster's files and each round's shuffler spool and log go (default: a temporary one)")
    arguments = parser.parse_args(argv)
    if arguments.kills < 1 or arguments.users < 1:
        parser.error("--kills and --users must be at least 1")
    if arguments.directory is not None:
        return asyncio.run(run(arguments.kills, arguments.users, arguments.directory))
    with tempfile.TemporaryDirectory(prefix="shuffledp-cluster-kills-") as directory:
        return asyncio.run(run(arguments.kills, arguments.users, Path(directory)))


if __name__ == "__main__":
    sys.exit(main())
