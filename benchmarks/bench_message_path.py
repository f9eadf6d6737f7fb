"""Throughput of the message path against the raw HPKE rates, all measured in the same run.

The floor no implementation can beat is the cryptography itself: per report, two HPKE
seals on the device (the report to the analyzer, the admission to the shuffler) and two
opens on the servers, with ``cryptography``'s HPKE. This script measures the raw seal and
open rates, then compares with them, as ratios within this one run (the machine may be
shared with other work: absolute figures are noisy, ratios of interleaved timings less so):

* **end to end**: ``shuffledp simulate`` with its defaults (20,000 users, two rounds, in-process
  channel; a fresh process, imports included), wall time against the raw-HPKE floor on all
  cores (the floor's CPU seconds over the usable cores); and the message engine in this
  process on one process against all cores (``run_messages(workers=1)`` and the default);
* **client**: randomize + pad + seal + wrap, against two raw seals per report (one core);
* **shuffler**: admission (outer open, credential, replay and quota checks, spool) against
  raw outer opens (one core);
* **analyzer**: open + decode + validate + collect against raw inner opens (one core; the
  target is at least 70 %), and the same batch on 2 worker processes against 1.

Run: ``python benchmarks/bench_message_path.py [--quick] [--out DIR]``; writes message_path.json
and message_path.png into the output folder (default ``bench-out/``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import arguments, best_of, parse, pin_one_core, write_result

from shuffledp.analyzer.service import Analyzer
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.simulation.population import Population
from shuffledp.protocol.wire import codec
from shuffledp.client.mechanisms import randomize_reports
from shuffledp.protocol.wire.messages import Envelope, HadamardRangeParams, ProjectedMeanParams, Report, RoundSpec
from shuffledp.protocol.wire.onion import envelope_format, envelope_info
from shuffledp.protocol.wire.report_format import HPKE_OVERHEAD, report_format
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.wire.sealing import SUITE, Sealer, report_info
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from shuffledp.shuffler.service import RoundAdmission, batch_chunks
from shuffledp.analyzer.scalar_mean import ScalarMeanProtocol
from shuffledp.simulation import SimulationConfig
from shuffledp.simulation.worker_parent import message_workers
from shuffledp.simulation.engine import run_messages

N = 20_000
N_QUICK = 100


def report_sizes(range_spec: RoundSpec, source: SeededSource, users: int = 5000) -> dict:
    """Bytes per report before and after padding, over many randomized reports of each mechanism."""
    mean_spec = dataclasses.replace(range_spec, round_id=1, params=ProjectedMeanParams(-0.7, 4.1))
    out = {}
    for spec in (range_spec, mean_spec):
        values = randomize_reports(spec, np.random.default_rng(1).normal(1.7, 3.0, users), source)
        messages = values.reshape(-1, values.shape[-1])  # (users, messages per user, width) -> one row a message
        unpadded = [len(codec.encode(Report(spec.round_id, spec.mechanism, tuple(int(x) for x in m)))) + HPKE_OVERHEAD
                    for m in messages]
        layout = report_format(spec.round_id, spec.mechanism)
        out[spec.mechanism] = {
            "unpadded_min": min(unpadded), "unpadded_max": max(unpadded),
            "sealed": layout.sealed_size, "envelope": envelope_format(spec.round_id, spec.mechanism).size,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__, quick=f"{N_QUICK} reports, one timing of each (a smoke run)"), argv)
    n = N_QUICK if args.quick else N
    repeats = 1 if args.quick else 3
    load_at_start = os.getloadavg()[0]
    all_cpus = os.sched_getaffinity(0)
    pin_one_core()
    deployment = Deployment()
    analyzer = deployment.analyzer()
    session = deployment.session_id
    spec = RoundSpec(
        session_id=session, round_id=0, params=HadamardRangeParams(-20.0, 20.0, 0.8), epsilon0=0.5,
        analyzer_key=analyzer.keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=n, max_batch=n,
        deadline=time.time() + 3600,
    )
    source = SeededSource(5)
    clients = [deployment.client(np.array([y]), PrivacyLedger(1e9), source=source) for y in np.random.default_rng(0).normal(1.7, 0.3, n)]
    sealer = Sealer(spec.analyzer_key)
    envelopes: list[bytes] = []

    def answer_all():
        envelopes.clear()
        for c in clients:
            c.ledger.answered.clear()
            envelopes.extend(c.answer_verified(spec, sealer))

    t_client = best_of(answer_all, repeats=1)
    # Two raw seals per report, on the same payload sizes: the report to the analyzer, the admission to the shuffler.
    layout = report_format(spec.round_id, spec.mechanism)
    inner_payload = bytes(layout.size)
    admission_payload = bytes(envelope_format(spec.round_id, spec.mechanism).admission_size)
    analyzer_public = X25519PublicKey.from_public_bytes(spec.analyzer_key)
    shuffler_public = X25519PublicKey.from_public_bytes(spec.shuffler_key)
    inner_info = report_info(session, 0, spec.digest)
    outer_seal_info = envelope_info(session, 0, spec.digest)

    def raw_two_seals():
        for _ in range(n):
            SUITE.encrypt(inner_payload, analyzer_public, info=inner_info)
            SUITE.encrypt(admission_payload, shuffler_public, info=outer_seal_info)

    seals, clients_t = [], [t_client]
    for i in range(repeats):
        seals.append(best_of(raw_two_seals, repeats=1))
        if i:
            clients_t.append(best_of(answer_all, repeats=1))
    t_two_seals, t_client = min(seals), min(clients_t)

    def admit_all():
        admission = RoundAdmission(spec, deployment.shuffler_keys, deployment.issuer)
        for start in range(0, len(envelopes), 4096):  # bursts, as the service drains its queue
            admission.offer_many(envelopes[start : start + 4096])
        assert admission.stats.admitted == n
        return admission

    outers = [codec.decode(e, Envelope).outer for e in envelopes]
    outer_info = envelope_info(session, 0, spec.digest)
    shuffler_private = deployment.shuffler_keys.hpke_private

    def raw_outer_open():
        for o in outers:
            SUITE.decrypt(o, shuffler_private, info=outer_info)

    raw_outer, admit = [], []
    for _ in range(repeats):
        raw_outer.append(best_of(raw_outer_open, repeats=1))
        admit.append(best_of(admit_all, repeats=1))
    t_raw_outer, t_admit = min(raw_outer), min(admit)
    payloads = admit_all().shuffled_payloads()
    batch_bytes = batch_chunks(spec, deployment.shuffler_keys, os.urandom(16), payloads, n)[0]
    private = analyzer.keys.hpke_private
    info = report_info(session, 0, spec.digest)

    def raw_open():
        for p in payloads:
            SUITE.decrypt(p, private, info=info)

    def analyzer_open():
        opened = analyzer.open_batch_bytes(batch_bytes, spec)
        assert opened.size == n

    # Interleave the two so both see the same machine conditions.
    raw, full = [], []
    for _ in range(1 if args.quick else 5):
        raw.append(best_of(raw_open, repeats=1))
        full.append(best_of(analyzer_open, repeats=1))
    t_raw, t_full = min(raw), min(full)

    # Several cores: the same batch opened by 1 and by 2 worker processes, unpinned, interleaved.
    os.sched_setaffinity(0, all_cpus)
    parallel = Analyzer(analyzer.keys, workers=2)
    try:
        parallel.open_batch_bytes(batch_bytes, spec)  # start the workers outside the timing
        one, two = [], []
        for _ in range(repeats):
            one.append(best_of(analyzer_open, repeats=1))
            two.append(best_of(lambda: parallel.open_batch_bytes(batch_bytes, spec), repeats=1))
        t_one, t_two = min(one), min(two)
    finally:
        parallel.close()
    pin_one_core()

    sizes = report_sizes(spec, source, users=n if args.quick else 5000)

    # End to end, on every core: `shuffledp simulate` (defaults) in a fresh process, and the message
    # engine in this one on one process and on all; interleaved, best of `repeats`.
    os.sched_setaffinity(0, all_cpus)
    users = n if args.quick else 20_000
    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), users, 1.0, path="messages", seed=1)
    protocol = ScalarMeanProtocol(config.protocol_config())
    means = np.random.default_rng(1).normal(1.7, 1.0 / np.sqrt(50), users)
    workers = message_workers(users) if not args.quick else 2
    command = [sys.executable, "-m", "shuffledp.cli", "simulate", "--json", "--quiet"] + (["--users", str(users)] if args.quick else [])
    simulate, one_process, all_processes = [], [], []
    for _ in range(1 if args.quick else 2):
        t0 = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        simulate.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"shuffledp simulate failed:\n{proc.stderr[-2000:]}")
        json.loads(proc.stdout)  # it ran and printed its result
        one_process.append(best_of(lambda: run_messages(protocol, means, 1, workers=1), repeats=1))
        all_processes.append(best_of(lambda: run_messages(protocol, means, 1, workers=workers), repeats=1))
    t_simulate, t_one_process, t_all = min(simulate), min(one_process), min(all_processes)
    cpus = len(all_cpus)
    # The floor: per report two seals and two opens (raw rates measured above, one core), over every core.
    floor_cpu_per_report = (t_two_seals + t_raw + t_raw_outer) / n
    floor_cpu = 2 * users * floor_cpu_per_report
    floor_all_cores = floor_cpu / cpus

    result = {
        "n": n,
        "raw_hpke_open_per_s": n / t_raw,
        "analyzer_open_decode_per_s": n / t_full,
        "analyzer_to_raw_ratio": t_raw / t_full,
        "target_ratio": 0.70,
        "client_reports_per_s": n / t_client,
        "raw_hpke_outer_open_per_s": n / t_raw_outer,
        "shuffler_admissions_per_s": n / t_admit,
        "shuffler_to_raw_ratio": t_raw_outer / t_admit,
        "cpus": len(all_cpus),
        "analyzer_two_workers_per_s": n / t_two,
        "two_workers_speedup": t_one / t_two,
        "raw_hpke_seal_per_s": 2 * n / t_two_seals,
        "client_to_two_raw_seals_ratio": t_two_seals / t_client,
        "client_besides_sealing_us_per_report": 1e6 * (t_client - t_two_seals) / n,
        "end_to_end": {
            "users": users,
            "reports": 2 * users,
            "simulate_command": " ".join(command[2:]),
            "simulate_wall_s": t_simulate,
            "raw_hpke_floor_cpu_s": floor_cpu,
            "raw_hpke_floor_all_cores_s": floor_all_cores,
            "floor_to_simulate_ratio": floor_all_cores / t_simulate,
            "engine_one_process_s": t_one_process,
            "engine_all_cores_s": t_all,
            "engine_workers": workers,
            "all_cores_speedup": t_one_process / t_all,
            "floor_to_engine_all_cores_ratio": floor_all_cores / t_all,
        },
        "noise": "the machine may be shared with other work while this runs: absolute rates are noisy; "
                 "each ratio compares timings taken in this run (interleaved, best of the repeats)",
        "load_average_1min": {"start": load_at_start, "end": os.getloadavg()[0]},
        "report_bytes": sizes,
    }
    path = write_result(args, "message_path", result, sizes={"n": n, "repeats": repeats})
    print(f"message path, one core, {n:,} reports (1-min load average {load_at_start:.1f} at the start, "
          f"{result['load_average_1min']['end']:.1f} at the end, on {cpus} CPUs)")
    print(f"  raw HPKE open                  {result['raw_hpke_open_per_s']:>10,.0f} /s (baseline)")
    print(f"  analyzer open+decode+validate  {result['analyzer_open_decode_per_s']:>10,.0f} /s "
          f"= {100 * result['analyzer_to_raw_ratio']:.1f} % of raw (target >= 70 %)")
    print(f"  raw HPKE open of outer layers  {result['raw_hpke_outer_open_per_s']:>10,.0f} /s (baseline)")
    print(f"  shuffler admission             {result['shuffler_admissions_per_s']:>10,.0f} /s "
          f"= {100 * result['shuffler_to_raw_ratio']:.1f} % of raw")
    print(f"  analyzer, 2 worker processes   {result['analyzer_two_workers_per_s']:>10,.0f} /s "
          f"= {result['two_workers_speedup']:.2f}x one process ({result['cpus']} CPUs)")
    print(f"  raw HPKE seal                  {result['raw_hpke_seal_per_s']:>10,.0f} /s (baseline)")
    print(f"  client randomize+seal+wrap     {result['client_reports_per_s']:>10,.0f} /s "
          f"= {100 * result['client_to_two_raw_seals_ratio']:.1f} % of two raw seals "
          f"({result['client_besides_sealing_us_per_report']:.0f} us/report besides them)")
    e2e = result["end_to_end"]
    print(f"  shuffledp simulate ({e2e['users']:,} users, 2 rounds)  {e2e['simulate_wall_s']:.2f} s wall; raw-HPKE floor "
          f"{e2e['raw_hpke_floor_cpu_s']:.2f} CPU-s = {e2e['raw_hpke_floor_all_cores_s']:.2f} s on {cpus} cores "
          f"-> floor/wall {e2e['floor_to_simulate_ratio']:.2f}")
    print(f"  message engine in-process      {e2e['engine_one_process_s']:.2f} s on 1 process, {e2e['engine_all_cores_s']:.2f} s "
          f"on {e2e['engine_workers']} workers ({e2e['all_cores_speedup']:.2f}x; floor/wall {e2e['floor_to_engine_all_cores_ratio']:.2f})")
    for mechanism, row in sizes.items():
        print(f"  {mechanism:<15} sealed report: unpadded {row['unpadded_min']}-{row['unpadded_max']} B "
              f"incl. 48 B of HPKE; padded {row['sealed']} B; envelope {row['envelope']} B")
    png = args.out / "message_path.png"
    plot(result, png)
    print(f"wrote {path} and {png}")
    return 0


#: Each part's target as a fraction of its raw-HPKE rate: the client and the shuffler at 85 %, the
#: analyzer at 70 %, ``shuffledp simulate`` within 1.3x the floor on all cores.
TARGETS = {"client": 0.85, "shuffler": 0.85, "analyzer": 0.70, "simulate": 1 / 1.3}


def plot(result: dict, path: Path) -> None:
    """Each part of the message path as a fraction of its raw-HPKE floor, measured in the same run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e2e = result["end_to_end"]
    # (label, fraction of the raw-HPKE rate, the target's fraction or None)
    rows = [
        ("client: randomize+seal+wrap\nvs two raw seals (1 core)", result["client_to_two_raw_seals_ratio"], TARGETS["client"]),
        ("shuffler admission\nvs raw outer opens (1 core)", result["shuffler_to_raw_ratio"], TARGETS["shuffler"]),
        ("analyzer open+decode\nvs raw inner opens (1 core)", result["analyzer_to_raw_ratio"], TARGETS["analyzer"]),
        (f"message engine, {e2e['engine_workers']} workers\nvs raw-HPKE floor on {result['cpus']} cores", e2e["floor_to_engine_all_cores_ratio"], None),
        (f"`shuffledp simulate` wall\nvs raw-HPKE floor on {result['cpus']} cores", e2e["floor_to_simulate_ratio"], TARGETS["simulate"]),
    ]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    labels, values, targets = zip(*rows)
    bars = ax.barh(range(len(rows)), values, color=["C0", "C0", "C0", "C1", "C1"])
    for bar, value in zip(bars, values):
        ax.text(min(value, 1.0) + 0.01, bar.get_y() + bar.get_height() / 2, f"{100 * value:.0f} %", va="center")
    for index, target in enumerate(targets):
        if target is not None:  # the target as a short red tick across its bar
            ax.plot([target, target], [index - 0.45, index + 0.45], color="C3", lw=2,
                    label="target" if index == 0 else None)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("fraction of the raw-HPKE rate (1 = the cryptography alone)")
    ax.set_title(f"Message path against raw HPKE, one run ({result['n']:,} reports per part; {e2e['users']:,} users end to end)\n"
                 "a shared machine: ratios within this run, absolute times noisy", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
