"""What specchat keeps on disk for the user: conversations in SQLite (`conversations`), atomic
writes and small JSON caches (`files`), and error positions in TOML files (`tomlpos`). Nothing here
loads a model or a UI, or knows what the engine accepts (the settings' schema is the service's).
"""
