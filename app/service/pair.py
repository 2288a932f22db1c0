"""A loaded pair: the target, its checked draft or MTP head, what they can do, and this machine's costs for
them. `load_pair` (`specchat.service.loader`) makes one; the conversation service answers with it."""

from __future__ import annotations

from typing import Callable

from specchat.decoding.guessers import Inputs
from specchat.decoding.history import HistoryIndex
from specchat.decoding.policy import CostCurve
from specchat.llama.model import Model
from specchat.llama.mtp import MtpHead
from specchat.service.costs import PairCosts


class LoadedPair:
    """A loaded target, its checked draft (if any), its MTP head (if it has one), and what they can do."""

    def __init__(self, target: Model, draft: Model | None, mtp: MtpHead | None = None,
                 rewinds: bool = True) -> None:
        self.target, self.draft, self.mtp = target, draft, mtp
        self.rewinds = rewinds  # the target's cache can take back a rejected guess
        self.warnings: list[str] = []  # why something the choice named was left out
        self.costs = PairCosts(target, draft, mtp)

    @property
    def name(self) -> str:
        return self.target.name + (f" + {self.draft.name}" if self.draft is not None else "")

    @property
    def capabilities(self) -> frozenset[str]:
        """What guessers may need that these models have (decoding.guessers.NEEDS); a service with the user's
        conversations adds "history"."""
        has = {"rewind": self.rewinds, "draft": self.draft is not None, "mtp": self.mtp is not None}
        return frozenset(need for need, there in has.items() if there and (need == "rewind" or self.rewinds))

    def curve(self, fresh: bool = False, waiting: Callable[[str], None] | None = None,
              measuring: Callable[[], None] | None = None) -> CostCurve:
        """This machine's decode cost curve for the pair, live (`PairCosts`): from the cache, or measured
        now on first use, or when `fresh` (a machine's speed drifts, and a benchmark should judge against
        today's). `waiting` hears it if another specchat's answer must end first; `measuring`, when a
        measurement begins."""
        return self.costs.ensure(fresh, waiting=waiting, measuring=measuring)

    def inputs(self, history: HistoryIndex | None = None, costs: bool = False) -> Inputs:
        """What the registry builds guessers from: these models, the conversations to copy from (if any),
        and, where `costs`, the live curve, measured first if it never was (here, in the service, and
        not from inside building a guesser)."""
        capabilities = self.capabilities | ({"history"} if history is not None and self.rewinds else set())
        curve = None
        if costs:
            curve = self.costs.curve if self.costs.calibration is not None else self.curve()
        return Inputs(self.target, self.draft, self.mtp, capabilities, curve, history, tuple(self.warnings))

    def close(self) -> None:
        """Free the models now, rather than whenever the garbage collector gets to them."""
        if self.mtp is not None:
            self.mtp.close()
        for model in (self.draft, self.target):
            if model is not None:
                model.close()
