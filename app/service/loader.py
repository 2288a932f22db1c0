"""The one way from a model choice (a pair name, or paths) to loaded models: the target, and a draft
model or the target's own MTP layers where there are any.

The app, the CLI and every measuring tool load through `load_pair`, so a draft is always checked
against its target the same way. Guessers are built from the loaded pair by the registry
(`specchat.decoding.guessers.registry`).
"""

from __future__ import annotations

import re
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.llama.model import Model
from specchat.llama.mtp import ASSISTANTS, MtpHead
from specchat.llama.vocab import VocabFile, check_compatible
from specchat.models.catalog import Catalog, load_catalog
from specchat.models.fetch import Progress, resolve
from specchat.service.choices import ModelChoice
from specchat.service.pair import LoadedPair

DEFAULT_CONTEXT = 4096


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
    rewinds = _rewinds(target, warnings)
    mtp, draft = None, None
    if draft_path is not None and _architecture(draft_path) in ASSISTANTS:
        # Not a model of its own but MTP layers made for another model's hidden state: the target's head.
        mtp, draft_path = _mtp_head(target, draft_path, warnings), None
    if mtp is None and target.n_nextn:
        mtp = _mtp_head(target, None, warnings)
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
    loaded = LoadedPair(target, draft, mtp, rewinds)
    loaded.warnings = warnings
    return loaded


def _architecture(path: Path) -> str:
    try:
        with VocabFile(path) as vocab:
            return str(vocab.metadata.get("general.architecture", ""))
    except SpecchatError:
        return ""  # loading it as a draft says what is wrong with it


def _mtp_head(target: Model, assistant: Path | None, warnings: list[str]) -> MtpHead | None:
    try:
        return MtpHead(target, assistant)
    except SpecchatError as e:
        warnings.append(f"no MTP drafting: {e}; the target runs with its other guessers")
        return None


def _rewinds(target: Model, warnings: list[str]) -> bool:
    """Whether the target's cache can take back a rejected guess, and a warning where it cannot."""
    if target.session.can_take_back():
        return True
    warnings.append(f"{target.name} keeps a state that llama.cpp can neither cut nor save, so a rejected guess "
                    "cannot be taken back: it decodes plainly (the none guesser)")
    return False


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
