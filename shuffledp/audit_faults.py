"""Planted faults for testing the local audit (:mod:`shuffledp.audit_local`). TEST ONLY.

:func:`planted_fault` monkeypatches one function of the shipped randomizer code for the
duration of a ``with`` block and restores it afterwards, so that the audit, which
runs the real code, runs the faulty code instead. Each fault patches the name where
the randomizer *looks it up at call time* (a module global), so every caller that
goes through that module is affected:

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
  about ``10.05``, which :data:`~shuffledp.audit_local.GAUSSIAN_STRESS` audits.
* ``krr-keep-too-high``: ``krr.krr_keep_probability(k, eps)`` returns that of
  ``eps + 0.1``; ``randomize_krr`` looks it up per call.
* ``laplace-scale-too-small``: ``mean_randomizer.laplace_scale(params, eps)`` returns
  ``G / (eps + 0.1)``: the Laplace reports are ``(eps0 + 0.1)``-LDP.

Not for production use: patching module globals is not thread-safe.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from fractions import Fraction

from shuffledp.protocol.errors import InvalidParameter

__all__ = ["FAULTS", "planted_fault"]

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


#: name -> (module, attribute, wrapper factory taking the original function)
FAULTS: dict[str, tuple[str, str, Callable[[Callable], Callable]]] = {
    "keep-too-high": ("shuffledp.client.range_randomizer", "keep_probability", _keep_too_high),
    "classical-gaussian": ("shuffledp.client.mean_randomizer", "gaussian_sigma2", _classical_gaussian),
    "krr-keep-too-high": ("shuffledp.client.krr", "krr_keep_probability", _krr_keep_too_high),
    "laplace-scale-too-small": ("shuffledp.client.mean_randomizer", "laplace_scale", _laplace_scale_too_small),
}


@contextlib.contextmanager
def planted_fault(name: str) -> Iterator[None]:
    """Run the block with the fault ``name`` (a key of :data:`FAULTS`) planted in the real code."""
    import importlib

    if name not in FAULTS:
        raise InvalidParameter("name", f"must be one of {sorted(FAULTS)}, got {name!r}")
    module_name, attribute, factory = FAULTS[name]
    module = importlib.import_module(module_name)
    original = getattr(module, attribute)
    setattr(module, attribute, factory(original))
    try:
        yield
    finally:
        setattr(module, attribute, original)
