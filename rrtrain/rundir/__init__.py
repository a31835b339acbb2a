"""The run directory's one owner: its names (`layout`), typed readers of its files (`readers`, `fields`), its
writers (`writers`, `metrics`, `lock`) and how a run ended (`outcome`). Nothing here imports torch at import time."""
