"""The conversation service, below every front end and above the engine. The app, `generate`, `serve` and
the measuring tools are thin adapters over it. Nothing here uses Textual.

- `choices`: the one place where the command line and the settings are merged (an option given wins).
- `local`: the one way to open this machine's models as a service, for every front end, and the app's
  backend over them or over a server (`open_backend`).
- `loader`: from a model choice to a loaded pair, a draft that cannot be had left out with a reason.
- `pair`: a loaded pair, what it can do, and the fixed inputs the registry builds guessers from.
- `costs`: a pair's cost curve, checked before it is trusted and corrected by quiet answers; the turns
  that keep two specchat processes from answering at once.
- `chat`: the service over a pair: the prompter and KV-cache reuse across turns, the guessers and their
  restart rule, the context policy.
- `reasoning`: how a chat template marks thinking, read off the template, and the pure text splitter.
- `thinking`: the engine's events with a reasoning model's thinking split out of the answer.
- `toolsplit`: the engine's events with an answer's tool calls split out, where it was asked with tools.
- `history`: the history index kept in step with the stored conversations.
- `events`: what the service adds to the engine's events (a `Notice`, a server's `Chunk`).
- `backend`: the one protocol the app talks to; `remote`: that protocol over any OpenAI-compatible server.
- `conversation`: one conversation in the store: partial saves, regenerate and edit as branches, export,
  attachments, and a window's place in it (the selected message, the edit under way).
- `listing`: the list of conversations: all of them, or those a search finds.
- `documents`: rewrite mode's documents: chunks, prompts, word diffs, the review, safe saves.
- `settings`: the user's settings, checked against what the engine accepts and kept in TOML with the
  user's comments.
"""
