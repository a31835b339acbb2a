"""Dashboards over a sweep's run directories: TensorBoard on loopback with per-size charts and HParams."""
