"""Throughput of the message path against the raw HPKE open rate, in the same run.

The analyzer's work per report is: open the HPKE-sealed payload, decode the CBOR
report, validate it against the round, and collect the values. Its rate is
compared with the raw rate of ``Suite.decrypt`` on the same sealed payloads, the
floor no implementation can beat; the target is at least 70 %. The shuffler's
admission (open the outer layer, verify the credential, check replays and quotas)
is compared the same way with the raw HPKE open of the outer layers. Also
reported: the client's rate (randomize + encode + seal + wrap), opening one batch
with 2 worker processes against 1 (both cores unpinned, same run), and the
end-to-end in-process protocol.

Run: ``python benchmarks/bench_message_path.py [--quick] [--out DIR]``; writes message_path.json
into the output folder (default ``bench-out/``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

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
from shuffledp.shuffler.service import RoundAdmission, batch_chunks
from shuffledp.simulation import SimulationConfig, run_simulation

N = 20_000
N_QUICK = 300


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

    population = Population("gaussian", 1.7, 1.0, 20.0, 10)
    t0 = time.perf_counter()
    run_simulation(SimulationConfig(population, n, 1.0, path="messages", seed=1))
    t_end_to_end = time.perf_counter() - t0

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
        "end_to_end_users_per_s_two_rounds": n / t_end_to_end,
        "report_bytes": sizes,
    }
    path = write_result(args, "message_path", result, sizes={"n": n, "repeats": repeats})
    print(f"message path, one core, {n:,} reports")
    print(f"  raw HPKE open                  {result['raw_hpke_open_per_s']:>10,.0f} /s (baseline)")
    print(f"  analyzer open+decode+validate  {result['analyzer_open_decode_per_s']:>10,.0f} /s "
          f"= {100 * result['analyzer_to_raw_ratio']:.1f} % of raw (target >= 70 %)")
    print(f"  client randomize+seal+envelope {result['client_reports_per_s']:>10,.0f} /s")
    print(f"  raw HPKE open of outer layers  {result['raw_hpke_outer_open_per_s']:>10,.0f} /s (baseline)")
    print(f"  shuffler admission             {result['shuffler_admissions_per_s']:>10,.0f} /s "
          f"= {100 * result['shuffler_to_raw_ratio']:.1f} % of raw")
    print(f"  analyzer, 2 worker processes   {result['analyzer_two_workers_per_s']:>10,.0f} /s "
          f"= {result['two_workers_speedup']:.2f}x one process ({result['cpus']} CPUs)")
    print(f"  end to end, two rounds         {result['end_to_end_users_per_s_two_rounds']:>10,.0f} users/s")
    for mechanism, row in sizes.items():
        print(f"  {mechanism:<15} sealed report: unpadded {row['unpadded_min']}-{row['unpadded_max']} B "
              f"incl. 48 B of HPKE; padded {row['sealed']} B; envelope {row['envelope']} B")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
