"""The fast engine in this process against the same engine on a local Dask cluster of 2 workers.

Two workloads, each a whole protocol run from users made block by block from their seeds:

* ``scalar``: the scalar range -> mean protocol (two rounds), n users with m = 10 samples each;
* ``vector``: the vector mean protocol (Algorithm 5, sampled mode, two rounds) at d = 1024,
  m = 2 samples per user.

For each, the local engine runs in a fresh process, and the Dask engine on a fresh
``LocalCluster`` of 2 worker processes (one thread each), secured as ``--dask-workers`` secures
it (``private_cluster``: mutual TLS, 127.0.0.1): the wall time of the run (the
cluster's start-up, with the workers' imports of the engine, is reported apart), the speed
ratio local / Dask, and the peak resident memory (``ru_maxrss``) of the local process and of
each worker, read once the run is over,
so a peak is the run's own; and the CPU seconds (user + system) each process spent on the
run, which a loaded machine inflates far less than wall time. Both results are checked to be
equal to the last bit (the engine's guarantee), so the timing compares the same work.

Run: ``python benchmarks/bench_dask.py [--quick] [--out DIR] [--scalar-users N] [--vector-users N]``;
writes dask.json and dask.png into the output folder (default ``bench-out/``). ``--quick``: 100,000
scalar users, and the vector workload at d = 256 with 8,192 users (two draw blocks of 4,096, so
two tasks a round: the same code paths at a quarter of the values).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time

from _common import arguments, log, parse, write_result

SCALAR_USERS = 10_000_000
VECTOR_USERS = 100_000
DIM = 1024
WORKERS = 2
QUICK = {"scalar_users": 100_000, "vector_users": 8_192, "dim": 256}


def workload(kind: str, n: int, dim: int = DIM):
    """``(protocol, users)`` of one workload (``dim``: the vector workload's dimension): users made block by
    block from the seed."""
    from shuffledp.analyzer.scalar_mean import ScalarMeanProtocol
    from shuffledp.analyzer.vector_mean import VectorMeanProtocol
    from shuffledp.simulation import SimulationConfig
    from shuffledp.simulation.population import Population, generated_users
    from shuffledp.simulation.vector import VectorSimulationConfig
    from shuffledp.simulation.vector_population import VectorPopulation

    if kind == "scalar":
        population = Population("gaussian", 1.7, 1.0, 20.0, 10)
        config = SimulationConfig(population, n, 1.0, seed=1)
        return ScalarMeanProtocol(config.protocol_config()), generated_users(population, n, 1)
    population = VectorPopulation("gaussian", dim, 2)
    config = VectorSimulationConfig(population, n, 2.0, seed=1)
    return VectorMeanProtocol(config.protocol_config()), population.users(n, 1)


def _estimate(result) -> list[float]:
    estimate = result.mean.estimate if hasattr(result, "mean") else result.estimate
    return [float(x) for x in (estimate if hasattr(estimate, "__len__") else [estimate])]


def _local(kind: str, n: int, dim: int, queue) -> None:
    """In a fresh process: the local engine's wall time, peak memory (KiB) and result."""
    from shuffledp.simulation.engine import run_fast

    try:
        protocol, users = workload(kind, n, dim)
        cpu = _cpu_seconds()
        start = time.perf_counter()
        run = run_fast(protocol, users, seed=3)
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu
        queue.put((seconds, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _estimate(run.result)))
    except BaseException as exc:  # the parent waits on the queue: tell it
        queue.put(exc)
        raise


def local_run(kind: str, n: int, dim: int = DIM) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_local, args=(kind, n, dim, queue))
    process.start()
    answer = queue.get()
    process.join()
    if isinstance(answer, BaseException):
        raise SystemExit(f"{kind}: the local run failed: {answer}")
    seconds, cpu, peak_kib, estimate = answer
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mib": peak_kib / 1024, "estimate": estimate}


def _peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _import_engine() -> None:
    """What a worker imports to run its first block (timed apart, as the cluster's start-up is)."""
    import shuffledp.analyzer.scalar_mean  # noqa: F401
    import shuffledp.analyzer.vector_mean  # noqa: F401
    import shuffledp.simulation.dask_engine  # noqa: F401
    import shuffledp.simulation.vector_population  # noqa: F401


def dask_run(kind: str, n: int, dim: int = DIM) -> dict:
    """On a fresh LocalCluster of :data:`WORKERS` worker processes (so each peak is this run's)."""
    from distributed import Client

    from shuffledp.simulation.dask_engine import blocks_per_task, private_cluster, run_dask
    from shuffledp.simulation.engine import draw_block_users

    protocol, users = workload(kind, n, dim)
    start = time.perf_counter()
    with private_cluster(WORKERS) as cluster, Client(cluster) as client:  # the cluster --dask-workers starts
        client.wait_for_workers(WORKERS)
        client.run(_import_engine)
        started = time.perf_counter() - start
        before = client.run(_peak_rss_kib)
        cpu_before, client_cpu = client.run(_cpu_seconds), _cpu_seconds()
        start = time.perf_counter()
        run = run_dask(protocol, users, client, seed=3)
        seconds = time.perf_counter() - start
        cpu_after, client_cpu = client.run(_cpu_seconds), _cpu_seconds() - client_cpu
        peaks = client.run(_peak_rss_kib)
    blocks = -(-n // draw_block_users(users.shape[1] if users.ndim > 1 else 1))
    tasks = len(run.rounds) * -(-blocks // blocks_per_task(blocks, WORKERS))
    return {
        "seconds": seconds,
        "tasks": tasks,
        "cluster_start_seconds": started,
        "worker_idle_rss_mib": [v / 1024 for v in before.values()],
        "worker_peak_rss_mib": [v / 1024 for v in peaks.values()],
        "worker_cpu_seconds": [cpu_after[w] - cpu_before[w] for w in cpu_after],
        "client_cpu_seconds": client_cpu,
        "estimate": _estimate(run.result),
    }


def plot(result: dict, path) -> None:
    """Three panels per workload: wall time (with the speed ratio), CPU seconds, peak memory."""
    from shuffledp.progress import pyplot, save_figure

    plt = pyplot()
    fig, (speed, cpu, memory) = plt.subplots(1, 3, figsize=(13, 3.9))
    names = list(result["workloads"])
    runs = [result["workloads"][k] for k in names]
    labels = [f"{k}\nn = {w['users']:,}" for k, w in zip(names, runs)]
    x = list(range(len(names)))
    left, right = [i - 0.2 for i in x], [i + 0.2 for i in x]
    local = [w["local"]["seconds"] for w in runs]
    dask = [w["dask"]["seconds"] for w in runs]
    speed.bar(left, local, 0.4, label="local engine (1 process)")
    speed.bar(right, dask, 0.4, label=f"Dask, {WORKERS} workers")
    for i, w in enumerate(runs):
        speed.text(i, max(local[i], dask[i]) * 1.03, f"local / Dask = {w['speedup']:.2f}", ha="center", fontsize=8)
    speed.set_ylim(0, max(local + dask) * 1.25)
    speed.set_ylabel("wall time of the run (s)")
    speed.set_title(f"wall time ({result['cores']} cores, shared with other jobs)", fontsize=10)
    cpu.bar(left, [w["local"]["cpu_seconds"] for w in runs], 0.4, label="local process")
    workers = [sum(w["dask"]["worker_cpu_seconds"]) for w in runs]
    cpu.bar(right, workers, 0.4, label="Dask workers")
    cpu.bar(right, [w["dask"]["client_cpu_seconds"] for w in runs], 0.4, bottom=workers, label="Dask client")
    cpu.set_ylabel("CPU seconds (user + system)")
    cpu.set_title("CPU spent", fontsize=10)
    memory.bar(left, [w["local"]["peak_rss_mib"] for w in runs], 0.4, label="local process")
    memory.bar(right, [max(w["dask"]["worker_peak_rss_mib"]) for w in runs], 0.4, label="largest worker")
    memory.set_ylabel("peak resident memory (MiB)")
    memory.set_title("memory", fontsize=10)
    for ax in (speed, cpu, memory):
        ax.set_xticks(x, labels)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("benchmarks/bench_dask.py: the fast engine in one process against a LocalCluster of "
                 f"{WORKERS} worker processes", fontsize=10)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--scalar-users", type=int, default=None, help=f"scalar workload's n (default {SCALAR_USERS:,})")
    parser.add_argument("--vector-users", type=int, default=None, help=f"vector workload's n (default {VECTOR_USERS:,})")
    args = parse(parser, argv)
    sizes = dict(QUICK) if args.quick else {"scalar_users": SCALAR_USERS, "vector_users": VECTOR_USERS, "dim": DIM}
    sizes["scalar_users"] = args.scalar_users or sizes["scalar_users"]
    sizes["vector_users"] = args.vector_users or sizes["vector_users"]
    sizes["workers"] = WORKERS
    load = os.getloadavg()
    workloads = {}
    for kind, n in (("scalar", sizes["scalar_users"]), ("vector", sizes["vector_users"])):
        log(f"{kind}: n = {n:,}, local engine")
        local = local_run(kind, n, sizes["dim"])
        log(f"  {local['seconds']:.1f} s; Dask, {WORKERS} workers")
        dask = dask_run(kind, n, sizes["dim"])
        if dask["estimate"] != local["estimate"]:
            raise SystemExit(f"{kind}: the Dask engine's estimate differs from the local engine's")
        speedup = local["seconds"] / dask["seconds"]
        log(f"  {dask['seconds']:.1f} s (cluster start {dask['cluster_start_seconds']:.1f} s): x{speedup:.2f}; CPU s: "
            f"local {local['cpu_seconds']:.1f}, workers {sum(dask['worker_cpu_seconds']):.1f}, client {dask['client_cpu_seconds']:.1f}")
        workloads[kind] = {
            "users": n,
            "local": {k: v for k, v in local.items() if k != "estimate"},
            "dask": {k: v for k, v in dask.items() if k != "estimate"},
            "speedup": speedup,
            "identical_estimate": True,
            "local_users_per_second": n / local["seconds"],
            "dask_users_per_second": n / dask["seconds"],
            # CPU cost, the figure to extrapolate from: core-seconds per 10^8 users.
            "local_cpu_seconds_per_1e8_users": local["cpu_seconds"] * 1e8 / n,
            "dask_worker_cpu_seconds_per_1e8_users": sum(dask["worker_cpu_seconds"]) * 1e8 / n,
            # The client's work grows with the tasks (one submission, result and merge each), not the users.
            "dask_client_cpu_seconds_per_task": dask["client_cpu_seconds"] / dask["tasks"],
        }
    result = {
        "cores": os.cpu_count(),
        "load_average_at_start": list(load),
        "load_average_at_end": list(os.getloadavg()),
        "note": "wall times on a shared machine: other processes ran at the same time (see the load averages)",
        "workloads": workloads,
    }
    path = write_result(args, "dask", result, sizes)
    plot(result, args.out / "dask.png")
    log(f"wrote {path} and {args.out / 'dask.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
