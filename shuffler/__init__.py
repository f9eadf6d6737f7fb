"""The shuffler service: admit, batch, strip, permute, forward."""

from shuffledp.shuffler.permutation import secure_permutation
from shuffledp.shuffler.service import RoundAdmission, RoundStats, Shuffler

__all__ = ["RoundAdmission", "RoundStats", "Shuffler", "secure_permutation"]
