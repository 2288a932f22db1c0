"""What specchat keeps on disk for the user: conversations in SQLite (`conversations`), settings
in TOML that keep the user's comments (`settings`), atomic writes and small JSON caches (`files`),
and error positions in TOML files (`tomlpos`). Nothing here loads a model or a UI.
"""
