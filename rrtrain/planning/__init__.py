"""Before spending GPU-hours: `rrtrain bench` (throughput, MFU, memory), coordinate checks and the depth study.
The memory and time model behind `rrtrain plan` is `rrtrain.parallel.memory`, below the trainer, which uses it for
`train.micro_batch: auto` (`rrtrain.parallel.auto_batch`)."""
