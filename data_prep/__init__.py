"""The data-prep stage: corpus readers, tokenizers, the built-in synthetic corpus, packing, MDS shards, manifest.

Entry point: `rrtrain prep` (data_prep.cli.main); the pipeline itself is data_prep.prep.run_prep.
"""
