"""Managing the user's models: add one from anywhere, find the drafts for a target, record pairs.

What `specchat add`, `drafts`, `pair` and `remove` do, and what the app's Settings offer, in one
place. Compatibility is read from the tokenizers alone (see llama.vocab), so listing every model
on disk as a possible draft takes about a fifth of a second per model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from specchat.errors import SpecchatError
from specchat.llama.vocab import VocabFile, incompatibility
from specchat.models.catalog import Catalog, ModelEntry, load_catalog, size_text
from specchat.models.fetch import Progress, models_dir, on_disk, resolve
from specchat.models.sources import LocalFile, hub_file, parse_source, quantization, sha256_file
from specchat.models.usercat import UserCatalog


@dataclass(frozen=True)
class Added:
    name: str
    entry: ModelEntry
    path: Path | None  # on disk now (None: recorded, not fetched)


def default_name(file_name: str) -> str:
    """A catalog name from a file name: `Qwen2.5-7B-Instruct-Q4_K_M.gguf` -> `qwen2.5-7b-instruct-q4_k_m`."""
    return re.sub(r"[^a-z0-9._-]+", "-", Path(file_name).stem.lower()).strip("-") or "model"


def add_model(source_text: str, name: str | None = None, fetch: bool = True,
              progress: Progress | None = None) -> Added:
    """Record a model in the user catalog, with its size and sha256; a hub model is fetched unless
    `fetch` is false. The file is checked first: a file llama.cpp cannot read is never recorded."""
    source = parse_source(source_text)
    user = UserCatalog()
    catalog = load_catalog()
    if isinstance(source, LocalFile):
        path = source.path.resolve()
        with VocabFile(path) as vocab:  # a one-line error for a missing, damaged or non-GGUF file
            title = str(vocab.metadata.get("general.name") or path.stem)
            quant = vocab.quantization if quantization(path.name) == "?" else quantization(path.name)
        name = name or default_name(path.name)
        fields = {"title": title, "file": path.name, "quantization": quant,
                  "size": path.stat().st_size, "path": str(path), "sha256": None}
        _check_new(name, catalog)
        fields["sha256"] = sha256_file(path, progress)
    else:
        file, size, sha = hub_file(source)
        name = name or default_name(file)
        _check_new(name, catalog)
        fields = {"title": f"{source.repo} {Path(file).name}", "file": Path(file).name,
                  "quantization": quantization(file), "size": size, "sha256": sha,
                  "hf": {"repo": source.repo, "file": file}}
    user.add_model(name, fields)
    catalog = user.save()
    entry = catalog.model(name)
    path = resolve(entry, progress=progress) if fetch or isinstance(source, LocalFile) else on_disk(entry)
    return Added(name, entry, path)


def _check_new(name: str, catalog: Catalog) -> None:
    if name in catalog.models:
        raise SpecchatError(f"a model named {name!r} is already in the catalog; give another with --name NAME "
                            f"(or `specchat remove {name}` first)")


@dataclass(frozen=True)
class Candidate:
    """A possible draft for a target: a catalog model or a GGUF file on disk."""

    label: str  # the catalog name, or the path of a file outside the catalog
    name: str | None  # the catalog name, if it is in the catalog
    path: Path | None
    size: int | None
    reason: str | None  # why it cannot draft for the target; None if it can
    own: bool = False  # the target's own MTP layers, inside its file: no draft file needed

    @property
    def compatible(self) -> bool:
        return self.reason is None


def target_path(target: str, catalog: Catalog | None = None) -> Path:
    """A target named by catalog model, pair (its target) or path, as a file on disk."""
    catalog = catalog or load_catalog()
    if target in catalog.pairs:
        target = catalog.pairs[target].target
    if target in catalog.models:
        found = on_disk(catalog.models[target])
        if found is None:
            raise SpecchatError(f"model {target} is not on disk; `specchat pull {target}` first")
        return found
    path = Path(target).expanduser()
    if path.suffix == ".gguf" or path.exists():
        return path
    raise SpecchatError(f"{target!r} is neither a model in the catalog nor a file; `specchat models` lists them")


def find_drafts(target: Path, catalog: Catalog | None = None) -> list[Candidate]:
    """Every model in the catalogs and every GGUF file on disk (specchat's models directory and the
    Hugging Face cache), each with why it cannot draft for `target`, or None if it can: those that
    can come first, smallest (so fastest) first."""
    catalog = catalog or load_catalog()
    target = target.resolve()
    found: list[Candidate] = []
    with VocabFile(target) as tv:
        if tv.mtp_layers:  # the cheapest draft there is: one layer's work a token, in the target itself
            found.append(Candidate(f"its own MTP layers ({tv.mtp_layers}; the mtp guesser)", None, target, 0, None,
                                   own=True))
        target_size = target.stat().st_size
        for label, name, path, size in _everything(catalog):
            if path is None:
                reason = f"not on disk; `specchat pull {name}` to check it"
            elif path.resolve() == target:
                reason = "it is the target itself"
            else:
                size = path.stat().st_size
                try:
                    with VocabFile(path) as dv:
                        reason = incompatibility(tv, dv)
                except SpecchatError as e:
                    reason = str(e)
                if reason is None and size >= target_size:
                    reason = "it is no smaller than the target, so drafting with it cannot save time"
            found.append(Candidate(label, name, path, size, reason))
    return sorted(found, key=lambda c: (not c.own, not c.compatible, c.size or 0, c.label))


def _everything(catalog: Catalog) -> Iterator[tuple[str, str | None, Path | None, int | None]]:
    """(label, catalog name, path, size) of every catalog model, then of every other GGUF on disk."""
    seen: set[Path] = set()
    for entry in catalog.models.values():
        path = on_disk(entry)
        if path is not None:
            seen.add(path.resolve())
        yield entry.name, entry.name, path, entry.size
    for path in _gguf_files():
        if path.resolve() not in seen:
            seen.add(path.resolve())
            yield str(path), None, path, None


def _gguf_files() -> list[Path]:
    files = sorted(models_dir().glob("*.gguf")) if models_dir().is_dir() else []
    try:
        from huggingface_hub import scan_cache_dir

        for repo in scan_cache_dir().repos:
            for revision in repo.revisions:
                files += [f.file_path for f in revision.files if f.file_name.endswith(".gguf")]
    except Exception:  # no cache, or one the hub client cannot read: nothing more to list
        pass
    return files


def make_pair(name: str, target: str, draft: str | None = None, default: bool = False,
              catalog: Catalog | None = None, choose_draft: bool = True) -> tuple[str | None, str]:
    """Record a pair in the user catalog. With no draft, the fastest compatible one on disk is
    chosen, unless `choose_draft` is false (the target alone, by choice). Returns the draft (None:
    the target alone) and a line saying what was chosen and why."""
    catalog = catalog or load_catalog()
    if target not in catalog.models:
        raise SpecchatError(f"unknown model {target!r}; add it first (`specchat add PATH-or-hf:REPO`)")
    if draft is not None and draft not in catalog.models:
        raise SpecchatError(f"unknown model {draft!r}; add it first (`specchat add PATH-or-hf:REPO`)")
    draft, how = _draft_for(target, draft, catalog, choose_draft)
    user = UserCatalog()
    user.add_pair(name, target, draft)
    if default:
        user.doc["default_pair"] = name
    user.save()
    return draft, how


def _draft_for(target: str, draft: str | None, catalog: Catalog, choose_draft: bool) -> tuple[str | None, str]:
    """The draft a new pair gets (a named one, checked where both files are on disk, else the smallest compatible
    one on disk if `choose_draft`) and the line saying why."""
    t_path = on_disk(catalog.models[target])
    if draft is not None:
        d_path = on_disk(catalog.models[draft])
        if t_path is None or d_path is None:
            return draft, f"{draft} drafts (checked when both are on disk and the pair loads)"
        with VocabFile(t_path) as tv, VocabFile(d_path) as dv:
            why = incompatibility(tv, dv)
        if why is not None:
            raise SpecchatError(f"{draft} cannot draft for {target}: {why}; `specchat drafts {target}` lists "
                                "the models that can")
        return draft, f"{draft} drafts (its tokenizer matches)"
    if not choose_draft:
        return None, "no draft, by choice: the pair uses prompt lookup and plain decoding"
    if t_path is None:
        raise SpecchatError(f"model {target} is not on disk, so no draft can be chosen for it; `specchat pull {target}` "
                            "first, or name the draft")
    candidates = find_drafts(t_path, catalog)
    own = " (and its own MTP layers)" if candidates and candidates[0].own else ""
    usable = [c for c in candidates if c.compatible and not c.own]
    in_catalog = [c for c in usable if c.name is not None]
    if in_catalog:
        return in_catalog[0].name, \
            f"{in_catalog[0].name} drafts{own}: the smallest compatible model on disk ({size_text(in_catalog[0].size)})"
    if own:
        return None, "its own MTP layers draft (the mtp guesser): no draft file is needed"
    if usable:
        raise SpecchatError(f"the compatible drafts on disk are not in the catalog: add one with "
                            f"`specchat add {usable[0].path}` and pair again")
    return None, (f"no model on disk can draft for {target} (`specchat drafts {target}` says why): "
                  "the pair uses prompt lookup and plain decoding")


def remove_model(name: str) -> tuple[list[str], Path | None]:
    """Forget a model of the user catalog (and its pairs there); returns those pairs and the model's
    file, if it is on disk, for the caller to offer deleting."""
    catalog = load_catalog()
    path = on_disk(catalog.models[name]) if name in catalog.models else None
    user = UserCatalog()
    if name in catalog.models and name not in user.doc.get("models", {}):
        where = f"; its file is {path}, which you may delete" if path else ""
        raise SpecchatError(f"{name} ships with specchat and stays in its catalog{where}")
    pairs = user.remove_model(name)
    user.save()
    return pairs, path
