"""What the unit tests run on instead of real models and servers: a scripted model and its cache
(`model`), a scripted backend for the app (`backend`) and a small OpenAI-compatible server (`openai_server`).
The engine's claims themselves are shown on real GGUF models; these show everything around them."""

from fakes.backend import PAUSE_S, FakeBackend
from fakes.model import ScriptedModel, ScriptedSession

__all__ = ["FakeBackend", "PAUSE_S", "ScriptedModel", "ScriptedSession"]
