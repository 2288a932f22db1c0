"""`specchat serve`: an OpenAI-compatible HTTP server over the same engine, guessers and sampling as
the app. `api` holds the request models, error bodies and llama-server's `timings`; `worker` runs one
generation at a time on its own thread behind a bounded queue; `app` is the FastAPI routes, which turn
a request into a call on the same `ChatService` the app uses; `run` binds and serves.
It needs the optional extra: `pip install 'specchat[server]'`.
"""
