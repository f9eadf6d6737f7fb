"""Planted faults for testing the audits (``shuffledp audit``). TEST ONLY.

:func:`planted_fault` monkeypatches one function of the shipped code for the
duration of a ``with`` block and restores it afterwards, so that the audit, which
runs the real code, runs the faulty code instead. Each fault patches the name where
the code *looks it up at call time* (a module global, or a method on its class), so
every caller that goes through it is affected.

Randomizers and noise (caught by the local audit, :mod:`shuffledp.audit.local`, or
the summation audit, :mod:`shuffledp.audit.summation`):

* ``keep-too-high``: ``range_randomizer.keep_probability(eps)`` returns the keep
  probability of ``eps + 0.1``. ``randomize_range`` (hadamard-range, and vector-range
  through it) calls it per round: the true guarantee becomes ``eps0 + 0.1``
  (``eps0 + 0.1 D`` for paper mode's ``D`` reports at ``eps0 / D`` each).
* ``classical-gaussian``: ``mean_randomizer.gaussian_sigma2`` returns the classical
  ``(G sqrt(2 ln(1.25/delta)) / eps)^2`` (Dwork & Roth Thm 3.22, valid for eps <= 1
  only) instead of the exact discrete-Gaussian calibration. ``randomize_mean`` (and
  ``report_range`` through ``noise_tail_bound``) look it up per call, so the
  projected-mean and vector-mean Gaussian reports use it. The classical sigma is
  *larger* than the exact calibration (so still valid) up to eps ~ 8.8 at
  ``delta0 = 1e-6`` (5.8 at 0.1, 6.8 at 0.01): at ``(4, 1e-6)`` it is ``1.325 G``
  against ``1.194 G``, its delta at eps = 4 is ``5e-8``, and there is nothing to
  detect. It falls short at large eps: at ``(8, 0.1)`` sigma is ``0.281 G`` against
  ``0.321 G``, delta at eps = 8 is ``0.236`` and the true eps at delta = 0.1 is
  about ``10.05``, which :data:`~shuffledp.audit.local.GAUSSIAN_STRESS` audits.
* ``krr-keep-too-high``: ``krr.krr_keep_probability(k, eps)`` returns that of
  ``eps + 0.1``; ``randomize_krr`` looks it up per call.
* ``laplace-scale-too-small``: ``mean_randomizer.laplace_scale(params, eps)`` returns
  ``G / (eps + 0.1)``: the Laplace reports are ``(eps0 + 0.1)``-LDP.
* ``nbinom-reversed``: ``distributed_noise.negative_binomial(shape, p)`` is given the
  *failure* probability ``1 - p`` (scipy's and numpy's ``nbinom`` take the success
  probability): the Pólya shares are drawn from ``NB(1/n, alpha)`` instead of
  ``NB(1/n, 1 - alpha)`` and the summation noise all but vanishes.
* ``skellam-mu-too-small``: the vector client's ``skellam_shares(mu, users, ...)`` draws the
  shares of ``Skellam(mu / 100)``: every coordinate's noise has a tenth of the claimed standard
  deviation. ``client.summation`` imports ``skellam_shares`` into its own namespace, so that is
  where ``randomize_vector_sum`` looks it up at call time (and where the fault is planted;
  patching ``distributed_noise.skellam_shares`` would not reach the client).

The shuffler and the wire (caught by the mechanics audit, :mod:`shuffledp.audit.mechanics`):

* ``shuffler-arrival-order``: the shuffler's permutation is the identity for one
  batch in :data:`ARRIVAL_ORDER_EVERY` (the 1st, 11th, 21st, ... call in this block):
  those batches leave in arrival order.
* ``small-batch-release``: ``service.batch_releasable`` lets any non-empty round go,
  so a round below ``min_batch`` is released at its deadline.
* ``padding-off``: ``ReportFormat.encode_padded`` (what a client seals) returns the encoded
  report unpadded, so the sealed report's length (and the envelope's) depends on the
  reported values.
* ``analyzer-gets-credentials``: the shuffler appends the client id of each admitted
  envelope's credential to its sealed report, so the batch the analyzer receives
  links every report to its client.

Not for production use: patching module globals is not thread-safe.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from fractions import Fraction

from shuffledp.protocol.errors import InvalidParameter

__all__ = ["ARRIVAL_ORDER_EVERY", "FAULTS", "SKELLAM_MU_DIVISOR", "planted_fault"]

#: Excess epsilon of the "too high" / "too small" faults.
EXCESS = 0.1


def _keep_too_high(original: Callable) -> Callable:
    def keep_probability(epsilon: float) -> float:
        return original(epsilon + EXCESS)

    return keep_probability


def _classical_gaussian(original: Callable) -> Callable:
    def gaussian_sigma2(params, epsilon: float, delta: float) -> float:
        if not 0 < delta < 1:
            raise InvalidParameter("delta", f"must be in (0, 1) for Gaussian noise, got {delta}")
        sigma = params.grid_levels * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
        return sigma * sigma

    return gaussian_sigma2


def _krr_keep_too_high(original: Callable) -> Callable:
    def krr_keep_probability(k: int, epsilon: float) -> float:
        return original(k, epsilon + EXCESS)

    return krr_keep_probability


def _laplace_scale_too_small(original: Callable) -> Callable:
    def laplace_scale(params, epsilon: float) -> Fraction:
        return original(params, epsilon + EXCESS)

    return laplace_scale


#: Factor by which ``skellam-mu-too-small`` divides the Skellam ``mu``.
SKELLAM_MU_DIVISOR = 100.0


def _skellam_mu_too_small(original: Callable) -> Callable:
    def skellam_shares(mu_total, users, size, source):
        return original(mu_total / SKELLAM_MU_DIVISOR, users, size, source)

    return skellam_shares


def _nbinom_reversed(original: Callable) -> Callable:
    def negative_binomial(shape, success_prob, size, source):
        return original(shape, 1.0 - success_prob, size, source)

    return negative_binomial


#: One batch in this many leaves the faulty shuffler in arrival order.
ARRIVAL_ORDER_EVERY = 10


def _arrival_order(original: Callable) -> Callable:
    calls = [0]

    def secure_permutation(n: int):
        import numpy as np

        calls[0] += 1
        if (calls[0] - 1) % ARRIVAL_ORDER_EVERY == 0:
            return np.arange(n)
        return original(n)

    return secure_permutation


def _small_batch_release(original: Callable) -> Callable:
    def batch_releasable(admitted: int, spec) -> bool:
        return admitted >= 1

    return batch_releasable


def _padding_off(original: Callable) -> Callable:
    def encode_padded(self, values: tuple[int, ...]) -> bytes:
        from shuffledp.protocol.wire import codec
        from shuffledp.protocol.wire.messages import Report

        return codec.encode(Report(self.round_id, self.mechanism, tuple(values)))

    return encode_padded


def _analyzer_gets_credentials(original: Callable) -> Callable:
    def _record(self, batch) -> None:
        start = len(self.payloads)
        original(self, batch)
        for index, admitted in enumerate(batch, start):
            self.payloads[index] = self.payloads[index] + admitted.client_id

    return _record


#: name -> (module, attribute or Class.attribute, wrapper factory taking the original function)
FAULTS: dict[str, tuple[str, str, Callable[[Callable], Callable]]] = {
    "keep-too-high": ("shuffledp.client.range_randomizer", "keep_probability", _keep_too_high),
    "classical-gaussian": ("shuffledp.client.mean_randomizer", "gaussian_sigma2", _classical_gaussian),
    "krr-keep-too-high": ("shuffledp.client.krr", "krr_keep_probability", _krr_keep_too_high),
    "laplace-scale-too-small": ("shuffledp.client.mean_randomizer", "laplace_scale", _laplace_scale_too_small),
    "nbinom-reversed": ("shuffledp.protocol.mechanisms.distributed_noise", "negative_binomial", _nbinom_reversed),
    "skellam-mu-too-small": ("shuffledp.client.summation", "skellam_shares", _skellam_mu_too_small),
    "shuffler-arrival-order": ("shuffledp.shuffler.service", "secure_permutation", _arrival_order),
    "small-batch-release": ("shuffledp.shuffler.service", "batch_releasable", _small_batch_release),
    "padding-off": ("shuffledp.protocol.wire.report_format", "ReportFormat.encode_padded", _padding_off),
    "analyzer-gets-credentials": ("shuffledp.shuffler.service", "RoundAdmission._record", _analyzer_gets_credentials),
}


@contextlib.contextmanager
def planted_fault(name: str) -> Iterator[None]:
    """Run the block with the fault ``name`` (a key of :data:`FAULTS`) planted in the real code."""
    import importlib

    if name not in FAULTS:
        raise InvalidParameter("name", f"must be one of {sorted(FAULTS)}, got {name!r}")
    module_name, path, factory = FAULTS[name]
    owner = importlib.import_module(module_name)
    *classes, attribute = path.split(".")
    for class_name in classes:
        owner = getattr(owner, class_name)
    original = getattr(owner, attribute)
    setattr(owner, attribute, factory(original))
    try:
        yield
    finally:
        setattr(owner, attribute, original)
