"""Files copied as they are into every directory `rrtrain export --hf` writes, beside rrtrain's own model and
residual-rule package (rrtrain/export/bundle.py): the Hugging Face configuration and model classes. They are
loaded there, by transformers' `trust_remote_code` loader, as modules of that directory; nothing in rrtrain
imports them."""
