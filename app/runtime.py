"""Turning user choices (a pair name, or paths) into loaded models and a guesser."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.catalog import Catalog, load_catalog
from app.errors import SpecchatError
from app.fetch import Progress, resolve
from app.guessers import AutoGuesser, DraftGuesser, Guesser, LookupGuesser, NoGuesser
from app.llm import Model, check_compatible

GUESSERS = ("auto", "none", "draft", "lookup")


@dataclass(frozen=True)
class ModelChoice:
    pair: str | None = None
    target: Path | None = None
    draft: Path | None = None
    n_ctx: int = 4096
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


def load_target(path: Path, choice: ModelChoice) -> Model:
    return Model(path, n_ctx=choice.n_ctx, n_threads=choice.threads)


def make_guesser(name: str, target: Model, draft_path: Path | None, choice: ModelChoice) -> Guesser:
    if name == "none":
        return NoGuesser()
    if name == "lookup":
        return LookupGuesser()
    if name == "auto":
        from app.cost import load_curve

        draft = _load_draft(target, draft_path, choice) if draft_path is not None else None
        return AutoGuesser(load_curve(target, draft.model if draft else None), draft, piece=target.piece)
    if name == "draft":
        if draft_path is None:
            raise SpecchatError("the draft guesser needs a draft model: pass --draft PATH or use a --pair")
        return _load_draft(target, draft_path, choice)
    raise SpecchatError(f"unknown guesser {name!r}; choose one of {', '.join(GUESSERS)}")


def _load_draft(target: Model, path: Path, choice: ModelChoice) -> DraftGuesser:
    draft = Model(path, n_ctx=choice.n_ctx, n_threads=choice.threads)
    check_compatible(target, draft)
    return DraftGuesser(draft)
