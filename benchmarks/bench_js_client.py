"""The JavaScript device client (``js/``, ``@shuffledp/client``): bundle size and cost per report,
against the Python device client measured in the same run.

* **Bundle size**: ``esbuild --bundle --minify --format=esm --platform=browser`` of the package's
  entry ``js/src/index.ts`` alone and together with the MQTT transport ``js/src/transport/mqtt.ts``
  (what a web page ships), minified and gzipped (level 9); the ratio of the two.
* **Cost per report**: ``Client.answer`` of a signed round spec -- verify the analyzer's
  signature, check, randomize, pad, seal to the analyzer, wrap for the shuffler, charge a
  ``MemoryLedger`` -- for a ``hadamard-range`` and a ``projected-mean`` round, in Node
  (``js/test/support/bench_client.mjs``) and in headless Chromium (``bench_client_browser.mjs``:
  the same function bundled into a page served on 127.0.0.1, driven by playwright-core with a
  fresh profile), against the Python device client's ``client.Client.answer`` on the same signed
  specs, timed in this process before and after the JavaScript runs (the baseline is the better
  of the two). Every figure is the best of the repeats; each repeat answers ``reports`` times
  with fresh clients and ledgers made before the clock starts. Ratios are JavaScript time over
  Python time per report (above 1: JavaScript is slower).

The machine may be shared with other work: absolute figures are noisy, ratios of timings taken
in one run less so. Chromium is looked for at ``--chromium`` (default ``/usr/bin/chromium``);
without it the browser figures are skipped and the result says so.

Run: ``python benchmarks/bench_js_client.py [--quick] [--out DIR] [--chromium PATH]``; writes
js_client.json and js_client.png into the output folder (default ``bench-out/``). Needs Node >= 20
and the package's dependencies (``cd js && npm ci``); compiles ``js/dist`` when it is missing or
older than ``js/src``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import arguments, log, parse, write_result

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams, RoundSpec

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
SUPPORT = JS / "test" / "support"
REPORTS, REPORTS_QUICK = 1000, 10
REPEATS, REPEATS_QUICK = 3, 2
#: The rounds answered: (name, parameters, epsilon0, the device's local mean).
ROUNDS = (
    ("hadamard-range", HadamardRangeParams(-20.0, 20.0, 0.8), 0.5, 1.7),
    ("projected-mean", ProjectedMeanParams(-0.7, 4.1, "laplace", 4096), 1.0, 1.7),
)
#: Bundles measured: name -> esbuild entry source (resolved in js/).
BUNDLES = {
    "client": 'export * from "./src/index.ts";\n',
    "client + mqtt": 'export * from "./src/index.ts";\nexport * from "./src/transport/mqtt.ts";\n',
}


def node() -> str:
    path = shutil.which("node")
    if path is None:
        raise SystemExit("node (>= 20) is needed to measure the JavaScript client")
    return path


def ensure_built() -> None:
    """``npm ci`` where ``node_modules`` is missing, ``tsc`` where ``dist`` is older than a source."""
    if not (JS / "node_modules").is_dir():
        log("installing the package's dependencies (npm ci)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, capture_output=True)
    newest = max(p.stat().st_mtime for p in (JS / "src").rglob("*.ts"))
    built = JS / "dist" / "client" / "client.js"
    if not built.exists() or built.stat().st_mtime < newest:
        log("compiling the package (tsc)")
        result = subprocess.run([str(JS / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"], cwd=JS,
                                capture_output=True, text=True)
        if not built.exists():
            raise SystemExit(f"the JavaScript client does not compile:\n{result.stdout[-3000:]}")


def bundle_sizes() -> dict:
    """Minified and gzipped bytes of each bundle of :data:`BUNDLES`."""
    esbuild = JS / "node_modules" / ".bin" / "esbuild"
    out = {}
    for name, entry in BUNDLES.items():
        result = subprocess.run(
            [str(esbuild), "--bundle", "--minify", "--format=esm", "--platform=browser", "--loader=ts",
             "--sourcefile=entry.ts", "--log-level=error"],
            cwd=JS, input=entry.encode(), capture_output=True, timeout=300,
        )
        if result.returncode != 0:
            raise SystemExit(f"esbuild failed on the {name} bundle:\n{result.stderr.decode(errors='replace')[-3000:]}")
        out[name] = {"minified_bytes": len(result.stdout), "gzip_bytes": len(gzip.compress(result.stdout, 9))}
        log(f"bundle {name}: {out[name]['minified_bytes']:,} bytes minified, {out[name]['gzip_bytes']:,} gzipped")
    base, full = out["client"], out["client + mqtt"]
    out["mqtt_over_client_ratio"] = {"minified": full["minified_bytes"] / base["minified_bytes"],
                                     "gzip": full["gzip_bytes"] / base["gzip_bytes"]}
    return out


def signed_rounds(deployment: Deployment) -> list[tuple[str, bytes, float, RoundSpec]]:
    analyzer = deployment.analyzer()
    rounds = []
    for index, (name, params, epsilon0, local) in enumerate(ROUNDS):
        spec = RoundSpec(
            session_id=deployment.session_id, round_id=index, params=params, epsilon0=epsilon0,
            analyzer_key=analyzer.keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
            shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=1000,
            deadline=time.time() + 24 * 3600,
        )
        rounds.append((name, analyzer.sign_spec(spec), local, spec))
    return rounds


def python_seconds(deployment: Deployment, rounds, reports: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of ``reports`` Python ``Client.answer`` calls per round and repeat (fresh clients, made untimed)."""
    out: dict[str, list[float]] = {}
    for name, signed, local, _ in rounds:
        times = []
        for _ in range(repeats):
            clients = [deployment.client(np.array([local]), PrivacyLedger(1e9)) for _ in range(reports)]
            start = time.perf_counter()
            for client in clients:
                client.answer(signed)
            times.append(time.perf_counter() - start)
        out[name] = times
    return out


def js_request(deployment: Deployment, rounds, reports: int, repeats: int) -> dict:
    return {
        "analyzerSigningKey": deployment.analyzer_signing_key.hex(),
        "credential": deployment.enroll().hex(),
        "reports": reports,
        "repeats": repeats,
        "cases": [{"name": name, "signedSpec": signed.hex(), "localData": local} for name, signed, local, _ in rounds],
    }


def run_js(script: Path, request: dict, timeout: float) -> dict:
    result = subprocess.run([node(), str(script)], cwd=JS, input=json.dumps(request).encode(), capture_output=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{script.name} exited {result.returncode}: {result.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(result.stdout)


def per_report_us(seconds: list[float], reports: int) -> float:
    return 1e6 * min(seconds) / reports


def figure(result: dict, path: Path) -> None:
    from shuffledp.progress import pyplot, save_figure

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.4))
    names = list(BUNDLES)
    x = np.arange(len(names))
    sizes = result["bundle"]
    left.bar(x - 0.2, [sizes[n]["minified_bytes"] / 1024 for n in names], 0.4, label="minified")
    left.bar(x + 0.2, [sizes[n]["gzip_bytes"] / 1024 for n in names], 0.4, label="minified + gzip -9")
    for i, n in enumerate(names):
        left.annotate(f"{sizes[n]['gzip_bytes'] / 1024:.0f} KiB", (i + 0.2, sizes[n]["gzip_bytes"] / 1024),
                      ha="center", va="bottom", fontsize=8)
    left.set_xticks(x)
    left.set_xticklabels([f"{n}\n(esbuild, esm, browser)" for n in names])
    left.set_ylabel("KiB")
    left.set_title("bundle size of the JavaScript client")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    cost = result["cost_per_report_us"]
    runtimes = [r for r in ("python", "node", "chromium") if any(r in cost[m] for m in cost)]
    mechanisms = list(cost)
    width = 0.8 / len(runtimes)
    for j, runtime in enumerate(runtimes):
        values = [cost[m].get(runtime, np.nan) for m in mechanisms]
        bars = right.bar(np.arange(len(mechanisms)) + (j - (len(runtimes) - 1) / 2) * width, values, width,
                         label={"python": "Python client (baseline)", "node": "JS client, Node",
                                "chromium": "JS client, headless Chromium"}[runtime])
        if runtime != "python":
            for bar, m in zip(bars, mechanisms):
                ratio = result["ratios"][m].get(f"{runtime}_over_python")
                if ratio is not None:
                    right.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                   ha="center", va="bottom", fontsize=8)
    right.set_xticks(np.arange(len(mechanisms)))
    right.set_xticklabels(mechanisms)
    right.set_ylabel("microseconds per report (best of repeats)")
    right.set_title("Client.answer: verify, randomize, seal, wrap, charge\n(ratios: JS over Python, same run)")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    save_figure(fig, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, quick=f"{REPORTS_QUICK} reports per round, {REPEATS_QUICK} repeats (a smoke run)")
    parser.add_argument("--chromium", default="/usr/bin/chromium", metavar="PATH",
                        help="the Chromium executable for the browser figures (default /usr/bin/chromium)")
    args = parse(parser, argv)
    reports = REPORTS_QUICK if args.quick else REPORTS
    repeats = REPEATS_QUICK if args.quick else REPEATS
    timeout = 600.0 if args.quick else 3600.0
    load_at_start = os.getloadavg()[0]
    ensure_built()
    bundle = bundle_sizes()
    deployment = Deployment()
    rounds = signed_rounds(deployment)
    request = js_request(deployment, rounds, reports, repeats)

    log(f"Python client: {reports} reports x {repeats} repeats per round")
    python_before = python_seconds(deployment, rounds, reports, repeats)
    log("JS client in Node")
    in_node = run_js(SUPPORT / "bench_client.mjs", request, timeout)
    browser: dict | None = None
    browser_note = None
    if Path(args.chromium).is_file() and os.access(args.chromium, os.X_OK):
        log(f"JS client in headless Chromium ({args.chromium})")
        try:
            browser = run_js(SUPPORT / "bench_client_browser.mjs", {**request, "chromium": args.chromium}, timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            browser_note = f"the browser run failed: {' '.join(str(exc).split())[:500]}"
    else:
        browser_note = f"no Chromium executable at {args.chromium}: browser figures skipped"
    if browser_note:
        log(browser_note)
    log("Python client again (the baseline is the better of the two Python runs)")
    python_after = python_seconds(deployment, rounds, reports, repeats)

    cost: dict[str, dict[str, float]] = {}
    ratios: dict[str, dict[str, float]] = {}
    for name, *_ in rounds:
        python_us = per_report_us(python_before[name] + python_after[name], reports)
        cost[name] = {"python": python_us, "node": per_report_us(in_node["cases"][name]["seconds"], reports)}
        ratios[name] = {"node_over_python": cost[name]["node"] / python_us}
        if browser is not None:
            cost[name]["chromium"] = per_report_us(browser["cases"][name]["seconds"], reports)
            ratios[name]["chromium_over_python"] = cost[name]["chromium"] / python_us
            ratios[name]["chromium_over_node"] = cost[name]["chromium"] / cost[name]["node"]
    result = {
        "bundle": bundle,
        "cost_per_report_us": cost,
        "ratios": ratios,
        "reports": reports,
        "repeats": repeats,
        "seconds": {"python_before": python_before, "python_after": python_after,
                    "node": {n: c["seconds"] for n, c in in_node["cases"].items()},
                    "chromium": None if browser is None else {n: c["seconds"] for n, c in browser["cases"].items()}},
        "runtimes": {"python": sys.version.split()[0], "node": in_node["runtime"],
                     "chromium": None if browser is None else browser["runtime"]},
        "browser_page_bundle_bytes": None if browser is None else browser.get("bundleBytes"),
        "browser_note": browser_note,
        "rounds": {name: {"epsilon0": spec.epsilon0, "params": repr(spec.params)} for name, _, _, spec in rounds},
        "noise": "the machine may be shared with other work while this runs: absolute times are noisy; each ratio "
                 "compares timings taken in this run (best of the repeats; the Python baseline before and after)",
        "load_average_1min": {"start": load_at_start, "end": os.getloadavg()[0]},
    }
    path = write_result(args, "js_client", result, sizes={"reports": reports, "repeats": repeats})
    figure(result, path.with_suffix(".png"))
    print(f"JavaScript client ({in_node['runtime']}; 1-min load average {load_at_start:.1f} at the start, "
          f"{result['load_average_1min']['end']:.1f} at the end)")
    for name in BUNDLES:
        print(f"  bundle {name:<14} {bundle[name]['minified_bytes']:>10,} bytes minified {bundle[name]['gzip_bytes']:>9,} gzipped")
    print(f"  mqtt transport adds x{bundle['mqtt_over_client_ratio']['gzip']:.2f} (gzipped)")
    for name in cost:
        line = f"  {name:<15} Python {cost[name]['python']:>8,.0f} us/report (baseline)  Node {cost[name]['node']:>8,.0f} " \
               f"({ratios[name]['node_over_python']:.2f}x)"
        if "chromium" in cost[name]:
            line += f"  Chromium {cost[name]['chromium']:>8,.0f} ({ratios[name]['chromium_over_python']:.2f}x)"
        print(line)
    if browser_note:
        print(f"  {browser_note}")
    print(f"written to {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
