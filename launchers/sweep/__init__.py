"""The sweep before anything runs: the sweep file (`spec`), its runs (`expand`), their cost (`estimate`), the code
snapshot the runs import (`snapshot`), the sweep's locks (`lock`) and its record, `sweep.json` (`record`)."""
