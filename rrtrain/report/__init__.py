"""`rrtrain report SWEEP_DIR`: the paper's significance table and scaling plots from any sweep.

Modules, one job each:
- `collect`  — find run directories at any depth; read final.json, config.yaml, metrics.jsonl
- `spikes`   — the spike score (OLMo-core StabilityMonitor: loss > mean + 6σ of the previous 128)
- `stats`    — Welch's t-test, weighted line fit with intervals, noncentral-t power, Holm
- `analysis` — runs → per-size means, comparisons, trend, extrapolation, power (`analyze`)
- `render`   — report.md, results.csv, summary.json
- `plots`    — PNG figures (matplotlib, Agg canvas, no pyplot state)
- `atomic`   — write-aside-then-rename for every output

The command line (`rrtrain report`) is `rrtrain.cli.report`. See docs/report.md for how to read the output.
"""
