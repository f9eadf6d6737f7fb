"""Amplification-by-shuffling accountant.

Turns the local guarantee of a randomizer and the batch size a shuffler delivered
into a central ``(epsilon, delta)``, composes rounds into a session and reports every
bound it knows next to the one it uses. Every epsilon returned is an upper bound on
the true central epsilon; the exact shuffled-randomized-response value is reported as
a floor where it applies. See ``docs/accounting.md``.

Server-side only (imports scipy and dp-accounting); never import it from the client.

The names below load their module on first use (PEP 562), so that a module of this
package that needs none of them (the answer cache, :mod:`.cache`) imports without
scipy or dp-accounting, and a cached answer is served without loading them.
"""

from __future__ import annotations

from shuffledp.protocol.lazy_exports import lazy_exports

#: Each public name and the module of this package that defines it.
_EXPORTS = {
    "AmplificationNotClaimed": "guarantees",
    "account_plan": "composition",
    "check_central_delta": "composition",
    "default_central_delta": "composition",
    "mechanism_rule": "composition",
    "plan_dp_event": "dp_accounting_adapter",
    "plan_pld": "dp_accounting_adapter",
    "plan_round": "composition",
    "session_plan": "composition",
    "shuffled_session": "composition",
    "BOUND_NAMES": "shuffle_round",
    "BlockPairType": "guarantees",
    "ClonePair": "clones",
    "DEFAULT_ORDERS": "rdp",
    "EXTENDED_ORDERS": "rdp",
    "LocalGuarantee": "guarantees",
    "MECHANISMS": "guarantees",
    "RRCertificate": "rr_any_n",
    "RR_EXACT_MAX_N": "rr_exact",
    "RoundBound": "shuffle_round",
    "SessionAccountant": "session",
    "ShuffledPLDAccountant": "dp_accounting_adapter",
    "ShuffledRoundDpEvent": "dp_accounting_adapter",
    "VariationRatio": "guarantees",
    "WorstOfPairs": "clones",
    "binary_rr_guarantee": "guarantees",
    "block_hadamard_pair_types": "guarantees",
    "block_hadamard_response_guarantee": "guarantees",
    "certify_epsilon": "rr_any_n",
    "clone_pair_rdp": "rdp",
    "dominating_pairs": "shuffle_round",
    "fmt21_closed_form": "clones",
    "fmt21_closed_form_valid": "clones",
    "fmt21_pair": "clones",
    "gaussian_mean_guarantee": "guarantees",
    "generic_guarantee": "guarantees",
    "girgis_rdp": "rdp",
    "hadamard_response_guarantee": "guarantees",
    "in_strong_clone_class": "guarantees",
    "k_rr_guarantee": "guarantees",
    "laplace_mean_guarantee": "guarantees",
    "randomizer_matrix": "guarantees",
    "rdp_epsilon": "rdp",
    "round_delta_curve": "shuffle_round",
    "round_pld": "dp_accounting_adapter",
    "rr_delta": "rr_exact",
    "rr_exact_delta": "rr_exact",
    "rr_exact_epsilon": "rr_exact",
    "rr_lower_delta": "rr_exact",
    "rr_lower_epsilon": "rr_exact",
    "rr_monotone_epsilon": "rr_any_n",
    "shuffled_round": "shuffle_round",
    "strong_clone_pair": "clones",
    "variation_ratio_pair": "clones",
    "variation_ratio_parameters": "guarantees",
    "wor_subsampled_rdp": "rdp",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
