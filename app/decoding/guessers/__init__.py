"""Guessers: cheap proposals for the next tokens, checked by the target in one step.

One interface (`base`), guessers that copy (`copying`), guessers that draft token by token (`drafting`),
auto, which picks among them at every step by this machine's costs and may send copies that part ways as
one tree (`auto`; the places it copies from and the trees it sends in `sources`), and the registry that
names them all for the command line, the settings, the app and the server (`registry`).
"""

from specchat.decoding.guessers.auto import AutoGuesser, Drafter
from specchat.decoding.guessers.base import BaseGuesser, Guesser, NoGuesser, Proposal
from specchat.decoding.guessers.copying import HistoryGuesser, LookupGuesser, lookup, lookup_match, matches
from specchat.decoding.guessers.drafting import DraftGuesser, MtpGuesser, draft_tokens
from specchat.decoding.guessers.registry import GUESSERS, NEEDS, REGISTRY, Entry, Inputs, available, build, unavailable

__all__ = ["AutoGuesser", "BaseGuesser", "DraftGuesser", "Drafter", "Entry", "GUESSERS", "Guesser", "HistoryGuesser",
           "Inputs", "LookupGuesser", "MtpGuesser", "NEEDS", "NoGuesser", "Proposal", "REGISTRY", "available", "build",
           "draft_tokens", "lookup", "lookup_match", "matches", "unavailable"]
