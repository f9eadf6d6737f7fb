"""The analyzer: decoders, estimators, the analyzer service and the coordinator."""

from shuffledp.analyzer.coordinator import Coordinator
from shuffledp.analyzer.service import Analyzer, OpenedBatch

__all__ = ["Analyzer", "Coordinator", "OpenedBatch"]
