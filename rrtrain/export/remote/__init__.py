"""Files copied as they are into every directory `rrtrain export --hf` writes, beside rrtrain's own model and
residual-rule source (rrtrain/export/bundle.py): the Hugging Face configuration and model classes, and the
stand-ins for the parts of rrtrain the copied source imports. They are loaded there, by transformers'
`trust_remote_code` loader, as modules of that directory; nothing in rrtrain imports them."""
