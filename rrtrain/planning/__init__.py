"""Before spending GPU-hours: the memory and time planner, and `rrtrain bench` (throughput, MFU, memory)."""
