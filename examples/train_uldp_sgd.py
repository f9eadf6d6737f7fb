"""Train a logistic regression with user-level private SGD in the shuffle model (Algorithm 6).

Each step Poisson-samples a cohort of users; every sampled user clips its average
gradient over its own m samples and sends it through the vector mean protocol (random
rotation, a range round and a mean round, each report eps0/2-LDP), shuffled; the
accountant composes the step's two shuffled rounds, subsampled jointly, over T steps.
The local budget per step is calibrated so the whole session is (eps, delta)-DP; the
same model is trained without privacy for comparison::

    python examples/train_uldp_sgd.py                  # 100,000 users x 10 samples, eps = 2
    python examples/train_uldp_sgd.py --quick          # 20,000 users, 300 steps
"""

from __future__ import annotations

import argparse

from shuffledp.learning.data import synthetic_logistic
from shuffledp.cli.common import deprecated_alias
from shuffledp.size_cap import capped, note
from shuffledp.learning.uldp_sgd import TrainingConfig, calibrate_epsilon0, step_has_range_round, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--central-epsilon", type=float, default=2.0, help="the session's central epsilon")
    deprecated_alias(parser, "--epsilon", "--central-epsilon")  # the shuffledp commands' spelling (docs/cli.md)
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args(argv)
    documented = (20_000, 300, 1000) if args.quick else (100_000, 1000, 2000)
    users, steps, cohort = (capped(v) for v in documented)  # SHUFFLEDP_SIZE_CAP (README, testing)
    note([f"{name} {a} -> {b}" for name, a, b in zip(("users", "steps", "cohort"), documented, (users, steps, cohort))
          if a != b], "train_uldp_sgd.py")
    data = synthetic_logistic(users, 10, 15, seed=0)
    config = TrainingConfig(steps=steps, cohort=cohort, learning_rate=1.0, clip=0.25)
    range_round = step_has_range_round(data.dim, config.clip, cohort)  # one bin over [-C, C]: no range round
    epsilon0 = calibrate_epsilon0(args.central_epsilon, data.users, cohort, steps, args.delta, range_round=range_round)
    private = train(data, config, "uldp-shuffle", epsilon0=epsilon0, delta=args.delta)
    baseline = train(data, config, "nonprivate", account=False)
    print(f"{users:,} users x 10 samples, {steps} steps, cohorts of {cohort:,} (sampling rate {cohort / users:.3g})")
    print(f"  local budget per step eps0 = {epsilon0:.3f}; session (eps, delta) = "
          f"({private.privacy['epsilon']:.3f}, {args.delta:g}) after shuffling and subsampling")
    print(f"  test accuracy: ULDP-SGD {private.accuracy:.4f}, non-private {baseline.accuracy:.4f} "
          f"(gap {100 * (baseline.accuracy - private.accuracy):.2f} points); {private.seconds:.1f} s of private training")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
