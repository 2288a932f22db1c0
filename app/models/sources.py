"""Where a model a user adds comes from: a GGUF file on disk, or a file in a Hugging Face repository.

`specchat add SOURCE` takes a path, `hf:OWNER/REPO` (its Q4_K_M file), `hf:OWNER/REPO:QUANT` or
`hf:OWNER/REPO/FILE.gguf`, as Ollama and llama.cpp's `-hf` name them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.models.fetch import Progress, env_offline, probe_hub

DEFAULT_QUANT = "Q4_K_M"  # what most GGUF repositories publish, and what the catalog uses
_QUANT = re.compile(r"(?i)(?<![a-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?=\.gguf$|[-.])")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class LocalFile:
    path: Path


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str | None = None  # None: pick by quantization
    quant: str | None = None


def parse_source(text: str) -> LocalFile | HubFile:
    """A SOURCE argument: `hf:` names a hub repository, anything else is a path."""
    if not text.startswith("hf:"):
        return LocalFile(Path(text).expanduser())
    rest = text[3:].removeprefix("hf.co/").removeprefix("huggingface.co/")
    rest, _, quant = rest.partition(":")
    parts = rest.strip("/").split("/")
    if len(parts) < 2 or not all(parts) or (len(parts) > 2 and not parts[-1].endswith(".gguf")):
        raise SpecchatError(f"{text!r} is not a hub model: write hf:OWNER/REPO, hf:OWNER/REPO:QUANT or "
                            "hf:OWNER/REPO/FILE.gguf")
    repo = "/".join(parts[:2])
    return HubFile(repo, "/".join(parts[2:]) or None, quant or None)


def quantization(file_name: str) -> str:
    """The quantization a GGUF file name states (Q4_K_M, Q8_0, IQ4_XS, F16...), or '?'."""
    found = _QUANT.findall(Path(file_name).name)
    return found[-1].upper() if found else "?"


def pick_hub_file(repo: str, files: list[str], quant: str | None) -> str:
    """The .gguf file of `repo` with this quantization (default Q4_K_M); if there is none, or more
    than one, an error that lists what there is."""
    # A model split in parts needs every part beside the first; specchat fetches single files.
    ggufs = [f for f in files if f.endswith(".gguf") and not _SPLIT.search(f)]
    wanted = (quant or DEFAULT_QUANT).upper()
    matches = [f for f in ggufs if quantization(f) == wanted]
    if len(matches) == 1:
        return matches[0]
    listing = ", ".join(sorted(ggufs)[:20]) + (" …" if len(ggufs) > 20 else "")
    if not ggufs:
        raise SpecchatError(f"hf:{repo} has no .gguf files; pick a GGUF repository (its name usually ends in -GGUF)")
    if not matches:
        raise SpecchatError(f"hf:{repo} has no {wanted} file; its GGUF files: {listing}; add one as "
                            f"hf:{repo}/FILE.gguf or hf:{repo}:QUANT")
    raise SpecchatError(f"hf:{repo} has several {wanted} files ({', '.join(matches)}); add one as hf:{repo}/FILE.gguf")


def hub_file(source: HubFile) -> tuple[str, int | None, str | None]:
    """The file to fetch, its size and its sha256, as the hub reports them (needs the network)."""
    from huggingface_hub import HfApi

    if env_offline():
        raise SpecchatError(f"cannot look up hf:{source.repo}: specchat is offline (HF_HUB_OFFLINE or SPECCHAT_OFFLINE); "
                            "unset it, or add a downloaded file by its path")
    api = HfApi()
    try:
        probe_hub()
        file = source.file or pick_hub_file(source.repo, api.list_repo_files(source.repo), source.quant)
        info = api.get_paths_info(source.repo, [file])
    except SpecchatError:
        raise
    except Exception as e:  # the hub client raises many types: all mean "could not ask the hub"
        first = str(e).splitlines()[0] if str(e) else ""
        raise SpecchatError(f"could not look up hf:{source.repo} on the Hugging Face hub ({type(e).__name__}: "
                            f"{first}); check the name and your connection, or add a downloaded file by its path") from None
    if not info:
        raise SpecchatError(f"hf:{source.repo} has no file {file}")
    lfs = getattr(info[0], "lfs", None)
    return file, getattr(info[0], "size", None), getattr(lfs, "sha256", None)


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    """The file's sha256, read in large chunks (a 4 GB model takes seconds, not minutes)."""
    digest, size, done = hashlib.sha256(), path.stat().st_size, 0
    with path.open("rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(f"checking {path.name}: {done / 2**20:,.0f} of {size / 2**20:,.0f} MiB", done, size)
    return digest.hexdigest()
