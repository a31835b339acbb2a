"""Data loading for training: the streaming loader over `rrtrain prep`'s MDS shards, and shard verification."""
