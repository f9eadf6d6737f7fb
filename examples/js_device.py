"""A JavaScript device answering the Python parties: one round, every layer of the wire.

Run: ``python examples/js_device.py`` (after ``(cd js && npm ci && npm run build)``; needs
Node >= 20). The deployment's keys are made as ``shuffledp keys init`` makes them, in a new
temporary directory. The device is ``js/examples/device_round.mjs``, the npm package
``@shuffledp/client`` in Node: it reads its enrollment (the keys it pins and its credential)
from the key directory and keeps its privacy ledger in a file. The analyzer signs a round
spec; the device verifies it, randomizes its value, seals the report to the analyzer and
wraps it for the shuffler, charging its ledger first; the shuffler opens the outer layer and
signs its receipts and the round's outcome; the analyzer opens the report. Here the script
carries the messages between them (in a deployment, the broker does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.keys import init_keys, load_analyzer, load_shuffler
from shuffledp.protocol.wire.messages import AdmissionReceipts, HadamardRangeParams, RoundOutcome, RoundSpec
from shuffledp.protocol.wire.onion import EnvelopeOpener, signed_encoding

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "js" / "examples" / "device_round.mjs"
BUILD = "(cd js && npm ci && npm run build)"


def node_or_exit() -> str:
    node = shutil.which("node")
    if node is None:
        sys.exit("js_device.py: Node.js >= 20 is needed (node is not on PATH)")
    if not (ROOT / "js" / "dist" / "index.js").is_file():
        sys.exit(f"js_device.py: the JavaScript package is not built; run {BUILD}")
    return node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--value", type=float, default=1.7, help="the device's local value (default 1.7)")
    parser.add_argument("--budget", type=float, default=0.5, help="the device's local epsilon budget (default 0.5)")
    parser.add_argument("--dir", type=Path, help="keep the key directory and the ledger file here (a new directory)")
    args = parser.parse_args()
    node = node_or_exit()
    sys.stdout.reconfigure(line_buffering=True)  # our lines and the device's stay in order

    if args.dir is not None and args.dir.exists() and any(args.dir.iterdir()):
        sys.exit(f"js_device.py: --dir {args.dir} is not empty; give a new directory")
    work = args.dir or Path(tempfile.mkdtemp(prefix="shuffledp-js-device-"))
    try:
        one_round(node, work, args.value, args.budget, kept=args.dir is not None)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def one_round(node: str, work: Path, value: float, budget: float, *, kept: bool) -> None:
    """The round of the module docstring, with the keys and the device's ledger file in ``work``."""
    keys_dir, ledger_file = work / "keys", work / "device-ledger.json"
    init_keys(keys_dir, clients=1)  # what `shuffledp keys init DIR --users 1` writes
    analyzer_side, shuffler_side = load_analyzer(keys_dir), load_shuffler(keys_dir)
    deployment = Deployment(analyzer_side.analyzer_keys, shuffler_side.shuffler_keys, shuffler_side.issuer,
                            analyzer_side.session_id)
    analyzer = deployment.analyzer()
    spec = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=HadamardRangeParams(-20.0, 20.0, 0.8), epsilon0=0.5,
        analyzer_key=analyzer.keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=1, deadline=time.time() + 60,
    )
    signed_spec = analyzer.sign_spec(spec)  # what the device receives from the shuffler
    where = f" (kept in {work})" if kept else ""
    print(f"analyzer signed round 0: {len(signed_spec)} bytes; keys and enrollment made as `shuffledp keys init` "
          f"does{where}")

    device = subprocess.Popen(
        [node, str(DEVICE), "--keys", str(keys_dir), "--ledger", str(ledger_file),
         "--budget", str(budget), "--value", str(value)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stdout, text=True,
    )

    def ask(request: dict) -> dict:
        device.stdin.write(json.dumps(request) + "\n")
        device.stdin.flush()
        line = device.stdout.readline()
        if not line:
            sys.exit(f"js_device.py: the device stopped (exit status {device.wait()})")
        return json.loads(line)

    try:
        answer = ask({"signedSpec": signed_spec.hex()})
        envelopes = [bytes.fromhex(e) for e in answer["envelopes"]]

        # At the shuffler: the outer layer opens to the credential, a nonce and a sealed report it cannot read.
        admission = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec).open(envelopes[0])
        client_id = deployment.issuer.verify(admission.credential)
        print(f"shuffler admitted client {client_id.hex()[:8]}...: nonce {admission.nonce.hex()[:8]}..., "
              f"sealed report of {len(admission.sealed)} bytes")
        private = deployment.shuffler_keys.signing_private
        receipts = signed_encoding(private, AdmissionReceipts(spec.session_id, 0, spec.digest,
                                                              (admission.nonce,), (), ()))
        outcome = signed_encoding(private, RoundOutcome(spec.session_id, 0, spec.digest, "released", "", 1,
                                                        bytes(16), answer["instance"]))

        # At the analyzer (after shuffling): open the report.
        opened = analyzer.open_payloads([admission.sealed], spec)
        row, bit = opened.values[0]
        print(f"analyzer opened: Hadamard row {row}, bit {bit:+d}")

        settled = ask({"receipts": receipts.hex(), "outcome": outcome.hex()})
        status = device.wait(timeout=60)
    finally:
        if device.poll() is None:
            device.kill()
            device.wait()
    if status != 0 or settled["again"] != "budget":
        sys.exit(f"js_device.py: the device ended with status {status}: {settled}")
    ledger = json.loads(ledger_file.read_text())
    print(f"the device's ledger file holds: spent eps {ledger['spentEpsilon']} of {ledger['epsilonBudget']}, "
          f"outcomes {ledger['outcomes']}")


if __name__ == "__main__":
    main()
