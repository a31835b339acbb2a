"""Exporting a run's checkpoint for other tools: a Hugging Face model directory (`rrtrain export --hf`)."""
