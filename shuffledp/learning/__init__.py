"""Private learning: user-level private SGD on user-partitioned data."""
