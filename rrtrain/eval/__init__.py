"""Downstream evaluation through lm-evaluation-harness (`pip install 'rrtrain[eval]'`).

`lm.py`: rrtrain's model as an lm-eval `LM` (log-likelihoods and greedy generation, batched, any residual rule,
its requests split over the ranks of a run); `generate.py`: the greedy decoding, with a key/value cache or over
the plain forward; `tasks.py`: task names, the task index, the result file's key; `harness.py`: one
evaluation, its metrics flattened; `results.py`: the result file of `rrtrain eval`; `callback.py`: the same
evaluation inside training (`eval.downstream`). lm_eval is imported only when an evaluation is asked for.
"""
