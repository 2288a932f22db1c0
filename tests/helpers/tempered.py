"""A draft model for the exactness tests: the target's own file, seen at another temperature."""

from __future__ import annotations

from specchat.decoding.guessers import DraftGuesser, Guesser, LookupGuesser
from specchat.llama.model import Model


class Tempered:
    """The model seen at another temperature: its logits divided by `by`. It shares the target's
    tokenizer (it is the same file) and, under top-k, the same support, but q differs from p, as a real
    draft's does, so that the rejection branch is taken and its residual matters."""

    def __init__(self, model: Model, by: float) -> None:
        self.model, self.by = model, by

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    @property
    def session(self):
        return _TemperedSession(self.model.session, self.by)


class _TemperedSession:
    def __init__(self, session, by: float) -> None:
        self._session, self._by = session, by

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def decode(self, tokens, logits="last"):
        return self._session.decode(tokens, logits) / self._by


def guesser(name: str, draft: Model) -> Guesser:
    """The exactness tests' guessers by name: "draft", the draft sharper than the target (its logits doubled), so
    that a correction must come from the residual, away from the draft's favourite; or "lookup"."""
    return {"draft": lambda: DraftGuesser(Tempered(draft, 0.5)), "lookup": LookupGuesser}[name]()
