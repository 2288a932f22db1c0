"""The one way from a model choice (a pair name, or paths) to loaded models and guessers.

The app, the CLI and every measuring tool load through `load_pair`, so a draft is always
checked against its target the same way, and every guesser is built the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.llama.model import Model, check_compatible
from specchat.models.catalog import Catalog, load_catalog
from specchat.models.fetch import Progress, resolve
from specchat.spec.calibrate import MAX_POSITIONS, measure_curve
from specchat.spec.guessers import GUESSERS, AutoGuesser, DraftGuesser, Guesser, LookupGuesser, NoGuesser
from specchat.spec.policy import CostCurve
from specchat.store.files import cache_file, read_cache, update_cache

COSTS = "costs.json"  # this machine's cost curves, in the user cache dir
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class ModelChoice:
    pair: str | None = None
    target: Path | None = None
    draft: Path | None = None
    n_ctx: int | None = None  # None: DEFAULT_CONTEXT (the app: its context setting)
    threads: int | None = None
    fetch: bool = True
    offline: bool = False  # the app's offline setting: never fetch (HF_HUB_OFFLINE in the env does the same)


def model_paths(choice: ModelChoice, catalog: Catalog | None = None,
                progress: Progress | None = None) -> tuple[Path, Path | None]:
    """The target's path and the draft's (None if there is none), fetching catalog models if missing."""
    if choice.target is not None:
        if choice.pair is not None:
            raise SpecchatError("give either --pair or --target, not both")
        return choice.target, choice.draft
    catalog = catalog or load_catalog()
    pair = catalog.pair(choice.pair)
    target = resolve(catalog.model(pair.target), choice.fetch, progress, choice.offline)
    draft = choice.draft or resolve(catalog.model(pair.draft), choice.fetch, progress, choice.offline)
    return target, draft


class LoadedPair:
    """A loaded target, its checked draft (if any), and the guessers built over them."""

    def __init__(self, target: Model, draft: Model | None) -> None:
        self.target, self.draft = target, draft
        self._curve: CostCurve | None = None

    @property
    def name(self) -> str:
        return self.target.name + (f" + {self.draft.name}" if self.draft is not None else "")

    def guesser_names(self) -> list[str]:
        """The guessers this pair can run, in the registry's order."""
        return [g for g in GUESSERS if g != "draft" or self.draft is not None]

    def guesser(self, name: str) -> Guesser:
        """A new guesser of this name: each keeps its own state (auto's estimates, a draft's early stop)."""
        if name == "none":
            return NoGuesser()
        if name == "lookup":
            return LookupGuesser()
        if name == "draft":
            if self.draft is None:
                raise SpecchatError("the draft guesser needs a draft model: pass --draft PATH or use a --pair")
            return DraftGuesser(self.draft)
        if name == "auto":
            # Its own copy of the curve: auto keeps it current from the steps it times.
            return AutoGuesser(self.curve().copy(), DraftGuesser(self.draft) if self.draft is not None else None,
                               piece=self.target.piece)
        raise SpecchatError(f"unknown guesser {name!r}; choose one of {', '.join(GUESSERS)}")

    def curve(self, fresh: bool = False) -> CostCurve:
        """This machine's decode cost curve for the pair: cached per model file, backend and thread
        count and measured on first use, or measured now if `fresh` (a machine's speed drifts, and a
        benchmark should judge against today's). Guessers made afterwards start from it."""
        if self._curve is None or fresh:
            self._curve = _load_curve(self.target, self.draft, fresh)
        return self._curve

    def close(self) -> None:
        """Free both models now, rather than whenever the garbage collector gets to them."""
        for model in (self.draft, self.target):
            if model is not None:
                model.close()


def load_pair(choice: ModelChoice, progress: Progress | None = None, catalog: Catalog | None = None) -> LoadedPair:
    """Fetch what is missing (reporting its progress), load the target and the draft, and check that the
    draft fits the target."""
    target_path, draft_path = model_paths(choice, catalog, progress)
    n_ctx = choice.n_ctx or DEFAULT_CONTEXT
    target = Model(target_path, n_ctx=n_ctx, n_threads=choice.threads)
    draft = None
    if draft_path is not None:
        try:
            draft = Model(draft_path, n_ctx=n_ctx, n_threads=choice.threads)
            check_compatible(target, draft)
        except BaseException:
            if draft is not None:
                draft.close()
            target.close()
            raise
    return LoadedPair(target, draft)


def _curve_key(target: Model, draft: Model | None) -> str:
    return target.cache_key + "|" + (draft.cache_key if draft is not None else "")


def _load_curve(target: Model, draft: Model | None, fresh: bool) -> CostCurve:
    path = cache_file(COSTS)
    entry = None if fresh else read_cache(path).get(_curve_key(target, draft))
    if entry is not None and len(entry.get("verify_s", [])) == MAX_POSITIONS:
        return CostCurve(list(entry["verify_s"]), float(entry["draft_s"]))
    curve = measure_curve(target, draft)
    update_cache(path, _curve_key(target, draft),
                 {"verify_s": curve.verify_s, "draft_s": curve.draft_s, "measured": time.strftime("%Y-%m-%d")})
    return curve
