"""Amplification-by-shuffling accountant.

Turns the local guarantee of a randomizer and the batch size a shuffler delivered
into a central ``(epsilon, delta)``, composes rounds into a session and reports every
bound it knows next to the one it uses. Every epsilon returned is an upper bound on
the true central epsilon; the exact shuffled-randomized-response value is reported as
a floor where it applies. See ``docs/accounting.md``.

Server-side only (imports scipy and dp-accounting); never import it from the client.
"""

from shuffledp.protocol.accounting.clones import (
    ClonePair,
    WorstOfPairs,
    fmt21_closed_form,
    fmt21_closed_form_valid,
    fmt21_pair,
    strong_clone_pair,
    variation_ratio_pair,
)
from shuffledp.protocol.accounting.guarantees import (
    MECHANISMS,
    AmplificationNotClaimed,
    BlockPairType,
    LocalGuarantee,
    VariationRatio,
    binary_rr_guarantee,
    block_hadamard_pair_types,
    block_hadamard_response_guarantee,
    gaussian_mean_guarantee,
    generic_guarantee,
    hadamard_response_guarantee,
    in_strong_clone_class,
    k_rr_guarantee,
    laplace_mean_guarantee,
    randomizer_matrix,
    variation_ratio_parameters,
)
from shuffledp.protocol.accounting.rdp import (
    DEFAULT_ORDERS,
    EXTENDED_ORDERS,
    clone_pair_rdp,
    girgis_rdp,
    rdp_epsilon,
    wor_subsampled_rdp,
)
from shuffledp.protocol.accounting.rr_any_n import RRCertificate, certify_epsilon, rr_monotone_epsilon
from shuffledp.protocol.accounting.rr_exact import (
    RR_EXACT_MAX_N,
    rr_delta,
    rr_exact_delta,
    rr_exact_epsilon,
    rr_lower_delta,
    rr_lower_epsilon,
)
from shuffledp.protocol.accounting.session import SessionAccountant
from shuffledp.protocol.accounting.shuffle_round import (
    BOUND_NAMES,
    RoundBound,
    dominating_pairs,
    round_delta_curve,
    shuffled_round,
)

__all__ = [
    "AmplificationNotClaimed",
    "BOUND_NAMES",
    "BlockPairType",
    "ClonePair",
    "DEFAULT_ORDERS",
    "EXTENDED_ORDERS",
    "LocalGuarantee",
    "MECHANISMS",
    "RRCertificate",
    "RR_EXACT_MAX_N",
    "RoundBound",
    "SessionAccountant",
    "VariationRatio",
    "WorstOfPairs",
    "binary_rr_guarantee",
    "block_hadamard_pair_types",
    "block_hadamard_response_guarantee",
    "certify_epsilon",
    "clone_pair_rdp",
    "dominating_pairs",
    "fmt21_closed_form",
    "fmt21_closed_form_valid",
    "fmt21_pair",
    "gaussian_mean_guarantee",
    "generic_guarantee",
    "girgis_rdp",
    "hadamard_response_guarantee",
    "in_strong_clone_class",
    "k_rr_guarantee",
    "laplace_mean_guarantee",
    "randomizer_matrix",
    "rdp_epsilon",
    "round_delta_curve",
    "rr_delta",
    "rr_exact_delta",
    "rr_exact_epsilon",
    "rr_lower_delta",
    "rr_lower_epsilon",
    "rr_monotone_epsilon",
    "shuffled_round",
    "strong_clone_pair",
    "variation_ratio_pair",
    "variation_ratio_parameters",
    "wor_subsampled_rdp",
]
