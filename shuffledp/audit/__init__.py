"""The audit: local randomizers, the shuffled round, summation, the shuffler's mechanics and a session's claim."""
