"""User-partitioned data sets for private learning (``shuffledp/learning/uldp_sgd.py``).

A :class:`UserDataset` holds ``n`` users with ``m`` labelled samples each (features
already carry a constant intercept column) and a held-out test set of *other* users.

* :func:`synthetic_logistic`: a logistic model with user-level covariate shift
  (Algorithm 6's setting: each user holds ``m`` samples of its own).
* :func:`breast_cancer_users`: the Wisconsin breast-cancer table shipped *inside*
  scikit-learn (569 rows, 30 features, no download), rows partitioned into users.
  scikit-learn is an optional dependency (the ``learning`` extra: ``pip install -e ".[learning]"``);
  :func:`real_dataset_available` says whether it is importable.

Preprocessing of the real table (standardization with the *training* users' means and
standard deviations) is not privatized: it is the usual convention in DP-learning
benchmarks, and it leaks the 2 x 30 statistics of the training set. Features are then
scaled by ``1/sqrt(d)`` so a sample's norm is about 1 (a public constant).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.protocol.errors import InvalidParameter


@dataclass(frozen=True)
class UserDataset:
    """``features`` ``(n, m, p)`` with the intercept as last column, ``labels`` ``(n, m)`` in {0, 1};
    ``test_features`` ``(t, p)``, ``test_labels`` ``(t,)`` from users not in the training set."""

    name: str
    features: np.ndarray
    labels: np.ndarray
    test_features: np.ndarray
    test_labels: np.ndarray

    def __post_init__(self) -> None:
        if self.features.ndim != 3 or self.labels.shape != self.features.shape[:2]:
            raise InvalidParameter("features", f"must be (n, m, p) with labels (n, m), got {self.features.shape}, {self.labels.shape}")
        if self.test_features.ndim != 2 or self.test_features.shape[1] != self.features.shape[2]:
            raise InvalidParameter("test_features", f"must be (t, {self.features.shape[2]}), got {self.test_features.shape}")

    @property
    def users(self) -> int:
        return self.features.shape[0]

    @property
    def samples_per_user(self) -> int:
        return self.features.shape[1]

    @property
    def dim(self) -> int:
        """Model dimension (features plus intercept)."""
        return self.features.shape[2]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "users": self.users,
            "samples_per_user": self.samples_per_user,
            "dim": self.dim,
            "test_samples": int(self.test_labels.size),
            "positive_rate": float(self.labels.mean()),
        }


def _with_intercept(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, np.ones(x.shape[:-1] + (1,))], axis=-1)


def synthetic_logistic(
    users: int = 20_000,
    samples_per_user: int = 10,
    features: int = 15,
    *,
    margin: float = 4.0,
    heterogeneity: float = 0.5,
    test_users: int = 2_000,
    seed: int = 0,
) -> UserDataset:
    """Logistic task with user-level covariate shift.

    User ``i`` has a centre ``mu_i ~ N(0, I)``; its samples are
    ``x_ij = (h mu_i + z_ij) / sqrt((1 + h^2) d)`` with ``z_ij ~ N(0, I)`` (so ``E||x||^2 = 1``),
    and ``y_ij ~ Bernoulli(sigmoid(w* . x_ij + b*))`` with ``w* = margin sqrt(d) u`` for a
    uniform unit ``u`` (the logit ``w* . x`` is ``N(0, margin^2)``) and ``b* = 0.5``. The test
    set is ``test_users`` fresh users of the same law.
    """
    for name, value, low in (("users", users, 2), ("samples_per_user", samples_per_user, 1), ("features", features, 1), ("test_users", test_users, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InvalidParameter(name, f"must be an integer >= {low}, got {value!r}")
    if not (math.isfinite(margin) and margin > 0):
        raise InvalidParameter("margin", f"must be finite and > 0, got {margin}")
    if not (math.isfinite(heterogeneity) and heterogeneity >= 0):
        raise InvalidParameter("heterogeneity", f"must be finite and >= 0, got {heterogeneity}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x10C]))
    u = rng.normal(size=features)
    w = margin * math.sqrt(features) * u / np.linalg.norm(u)
    bias = 0.5
    scale = 1.0 / math.sqrt((1.0 + heterogeneity**2) * features)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        centres = rng.normal(size=(n, 1, features))
        x = (heterogeneity * centres + rng.normal(size=(n, samples_per_user, features))) * scale
        p = 1.0 / (1.0 + np.exp(-(x @ w + bias)))
        return x, (rng.random(p.shape) < p).astype(np.float64)

    x, y = draw(users)
    tx, ty = draw(test_users)
    return UserDataset(
        f"synthetic-logistic(d={features}, h={heterogeneity}, margin={margin})",
        _with_intercept(x), y, _with_intercept(tx.reshape(-1, features)), ty.reshape(-1),
    )


def real_dataset_available() -> bool:
    """Whether scikit-learn (which ships the breast-cancer table) is importable."""
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        return False
    return True


#: Column groups of the breast-cancer table as documented with it (10 measurements each).
BREAST_CANCER_GROUPS = {"mean": slice(0, 10), "se": slice(10, 20), "worst": slice(20, 30), "all": slice(0, 30)}


def breast_cancer_users(samples_per_user: int = 1, test_fraction: float = 0.2, seed: int = 0, columns: str = "all") -> UserDataset:
    """scikit-learn's bundled Wisconsin breast-cancer table, rows partitioned into users.

    ``columns`` picks one of the table's documented groups (:data:`BREAST_CANCER_GROUPS`):
    ``"mean"`` (10 features, model dimension 11, padded to 16 by the protocol's rotation)
    or ``"all"`` (30 features, dimension 31, padded to 32). The protocol's noise grows
    with the padded dimension squared, so the smaller group suits the few users here.

    Rows are shuffled (``seed``), grouped ``samples_per_user`` at a time into users (the
    remainder is dropped), and ``test_fraction`` of the users are held out. Label 1 is
    "benign" (as shipped). Standardized with the training users' statistics (not
    privatized, see the module docstring), scaled by ``1/sqrt(number of columns)``.
    """
    if isinstance(samples_per_user, bool) or not isinstance(samples_per_user, (int, np.integer)) or samples_per_user < 1:
        raise InvalidParameter("samples_per_user", f"must be an integer >= 1, got {samples_per_user!r}")
    if not 0 < test_fraction < 1:
        raise InvalidParameter("test_fraction", f"must be in (0, 1), got {test_fraction}")
    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from shuffledp.install import install_command

        raise ImportError(f"the real data set needs scikit-learn (the 'learning' extra): {install_command(('learning',))}") from exc
    if columns not in BREAST_CANCER_GROUPS:
        raise InvalidParameter("columns", f"must be one of {tuple(BREAST_CANCER_GROUPS)}, got {columns!r}")
    table = load_breast_cancer()
    x = np.asarray(table.data, dtype=np.float64)[:, BREAST_CANCER_GROUPS[columns]]
    y = np.asarray(table.target, dtype=np.float64)
    order = np.random.default_rng(np.random.SeedSequence([seed, 0xBC])).permutation(len(y))
    n_users = len(y) // samples_per_user
    if n_users < 4:
        raise InvalidParameter("samples_per_user", f"leaves only {n_users} users")
    rows = order[: n_users * samples_per_user].reshape(n_users, samples_per_user)
    n_test = max(1, int(round(test_fraction * n_users)))
    train, test = rows[n_test:], rows[:n_test]
    mean = x[train.ravel()].mean(axis=0)
    sd = x[train.ravel()].std(axis=0)
    sd[sd == 0] = 1.0
    z = (x - mean) / sd / math.sqrt(x.shape[1])
    return UserDataset(
        f"breast-cancer(m={samples_per_user}, columns={columns})",
        _with_intercept(z[train]), y[train], _with_intercept(z[test.ravel()]), y[test.ravel()],
    )
