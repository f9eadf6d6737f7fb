"""Studies of the protocols: robustness to corrupted users, the range check's failure rate."""
