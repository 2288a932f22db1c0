"""The conversation service, below every front end and above the engine: `loader` turns a model
choice (merged once from the command line and the settings) into a loaded pair; `chat` is the service
over it (the prompter, the guessers and their restart rule, the context policy, KV-cache reuse across
turns); `backend` is the one protocol the app talks to, local (`chat` on this machine's models) or
remote (`remote`, any OpenAI-compatible server); `conversation` keeps one conversation in the store
(partial saves, regenerate, edit-last, export, attachments); `documents` is rewrite mode's documents;
`settings` is the user's settings, checked against what the engine accepts and kept in TOML with the
user's comments.
The app, `generate`, `serve` and the measuring tools are thin adapters over it. Nothing here uses Textual.
"""
