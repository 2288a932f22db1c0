"""The one way from a model choice (a pair name, or paths) to loaded models and guessers.

The app, the CLI and every measuring tool load through `load_pair`, so a draft is always
checked against its target the same way, and every guesser is built the same way.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.llama.model import Model
from specchat.llama.vocab import check_compatible
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
    threads: int | None = None  # None: every core
    gpu_layers: int | None = None  # layers offloaded to the GPU (Metal, CUDA builds); None: all
    draft_gpu_layers: int | None = None
    fetch: bool = True
    offline: bool = False  # the app's offline setting: never fetch (HF_HUB_OFFLINE in the env does the same)


def left_out(why: str) -> str:
    """The warning for a draft left out: why, and what runs instead (the CLI, the server and the app
    all show it as it is)."""
    return f"no draft model: {why}; the target runs with prompt lookup and plain decoding"


def model_paths(choice: ModelChoice, catalog: Catalog | None = None,
                progress: Progress | None = None) -> tuple[Path, Path | None, list[str]]:
    """The target's path, the draft's (None if there is none) and why a draft the pair names was left
    out, fetching catalog models if missing. A draft that cannot be had is not an error: the target
    still answers with lookup and plain decoding."""
    if choice.target is not None:
        if choice.pair is not None:
            raise SpecchatError("give either --pair or --target, not both")
        return choice.target, choice.draft, []
    catalog = catalog or load_catalog()
    pair = catalog.pair(choice.pair)
    target = resolve(catalog.model(pair.target), choice.fetch, progress, choice.offline)
    if choice.draft is not None or pair.draft is None:
        return target, choice.draft, []
    try:
        return target, resolve(catalog.model(pair.draft), choice.fetch, progress, choice.offline), []
    except SpecchatError as e:
        return target, None, [left_out(str(e))]


class LoadedPair:
    """A loaded target, its checked draft (if any), and the guessers built over them."""

    def __init__(self, target: Model, draft: Model | None) -> None:
        self.target, self.draft = target, draft
        self.warnings: list[str] = []  # why a draft the choice named was left out
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
                raise SpecchatError(f"the draft guesser cannot run: {'; '.join(self.warnings)} (choose another guesser)"
                                    if self.warnings else
                                    "the draft guesser needs a draft model: pass --draft PATH or use a --pair")
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
    draft fits the target. A draft that is missing, fails to load, does not match the target or would
    not fit in memory is left out rather than failing the whole pair: lookup and plain decoding still
    work, and `LoadedPair.warnings` says why."""
    target_path, draft_path, warnings = model_paths(choice, catalog, progress)
    said, leave_out = _memory_warnings(target_path, draft_path)
    warnings += said
    draft_path = None if leave_out else draft_path
    n_ctx = choice.n_ctx or DEFAULT_CONTEXT
    target = Model(target_path, n_ctx=n_ctx, n_threads=choice.threads, n_gpu_layers=choice.gpu_layers)
    draft = None
    if draft_path is not None:
        try:
            draft = Model(draft_path, n_ctx=n_ctx, n_threads=choice.threads, n_gpu_layers=choice.draft_gpu_layers)
            check_compatible(target, draft)
        except SpecchatError as e:
            if draft is not None:
                draft.close()
                draft = None
            warnings.append(left_out(str(e)))
        except BaseException:
            if draft is not None:
                draft.close()
            target.close()
            raise
    loaded = LoadedPair(target, draft)
    loaded.warnings = warnings
    return loaded


def _memory_warnings(target: Path, draft: Path | None) -> tuple[list[str], bool]:
    """Before loading, the pair's file sizes against the memory free now (Linux only; elsewhere nothing
    is known and nothing is said): what to warn of, and whether the draft should be left out because
    the target fits alone and the pair does not."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        free = int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M).group(1)) * 1024  # type: ignore[union-attr]
        sizes = target.stat().st_size, draft.stat().st_size if draft is not None else 0
    except (OSError, AttributeError):
        return [], False
    gib = 2**30
    if sizes[0] > free:
        return [f"the target needs about {sizes[0] / gib:.1f} GiB and {free / gib:.1f} GiB of memory is free: "
                "it may swap or fail to load (close other programs, lower GPU layers, or pick a smaller model)"], False
    if sum(sizes) > free:
        return [left_out(f"the pair needs about {sum(sizes) / gib:.1f} GiB and {free / gib:.1f} GiB of memory is free "
                         "(close other programs, or pick a smaller pair)")], True
    return [], False


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
