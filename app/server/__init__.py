"""`specchat serve`: an OpenAI-compatible HTTP server over the same engine, guessers and sampling as
the app. `api` holds the request models, error bodies and llama-server's `timings`; `service` turns a
request into prompt tokens and engine events on the loaded pair; `worker` runs one generation at a
time on its own thread behind a bounded queue; `app` is the FastAPI routes; `run` binds and serves.
It needs the optional extra: `pip install 'specchat[server]'`.
"""
