"""The model catalog (`models.toml`): named models, their sources, and target/draft pairs.

specchat ships one inside the package; a `models.toml` in the user's config dir extends it (its
models and pairs are added, or replace shipped ones of the same name, and its `default_pair`, if
any, wins). SPECCHAT_CATALOG names a catalog that replaces both.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import platformdirs

from specchat.errors import SpecchatError
from specchat.store.tomlpos import dotted_key, locate


def shipped_catalog_path() -> Path:
    """The catalog installed with specchat (package data; a link to the checkout's in a source tree)."""
    return Path(str(resources.files("specchat").joinpath("models.toml")))


def user_catalog_path() -> Path:
    """The user's own catalog, which extends the shipped one."""
    return Path(platformdirs.user_config_dir("specchat")) / "models.toml"


@dataclass(frozen=True)
class HfSource:
    repo: str
    file: str


@dataclass(frozen=True)
class PypiSource:
    """A GGUF split into wheels: part n of `parts` is `package.format(n=n, i=n-1)`."""

    package: str
    version: str
    parts: int
    member: str
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{self.package.format(n=n, i=n - 1)}=={self.version}" for n in range(1, self.parts + 1)]

    def members(self) -> list[str]:
        return [self.member.format(n=n, i=n - 1) for n in range(1, self.parts + 1)]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    title: str
    file: str
    quantization: str
    size: int | None
    hf: HfSource | None
    pypi: PypiSource | None
    path: Path | None = None  # a file added from the user's disk, used where it is
    sha256: str | None = None  # of the whole file, recorded when it was added or downloaded


@dataclass(frozen=True)
class Pair:
    name: str
    target: str
    draft: str | None  # None: the target alone, with prompt lookup and plain decoding
    note: str


@dataclass(frozen=True)
class Catalog:
    models: dict[str, ModelEntry]
    pairs: dict[str, Pair]
    default_pair: str

    def model(self, name: str) -> ModelEntry:
        if name not in self.models:
            raise SpecchatError(f"unknown model {name!r}; known: {', '.join(sorted(self.models))}")
        return self.models[name]

    def pair(self, name: str | None = None) -> Pair:
        name = name or self.default_pair
        if name not in self.pairs:
            raise SpecchatError(f"unknown pair {name!r}; known: {', '.join(sorted(self.pairs))}")
        return self.pairs[name]


def size_text(n: int | None) -> str:
    """A model's size as the CLI and the app show it."""
    return f"{n / 2**20:,.0f} MiB" if n else "size ?"


def load_catalog(path: Path | None = None) -> Catalog:
    """The catalog at `path`; by default SPECCHAT_CATALOG, or else the shipped one extended by the user's."""
    if path is not None or os.environ.get("SPECCHAT_CATALOG"):
        return _read(path or Path(os.environ["SPECCHAT_CATALOG"]))
    shipped = _read(shipped_catalog_path())
    user = user_catalog_path()
    return _read(user, base=shipped) if user.is_file() else shipped


def _read(path: Path, base: Catalog | None = None) -> Catalog:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecchatError(f"model catalog not found: {path}") from None
    except OSError as e:  # a directory, no permission: still one line, not a traceback
        raise SpecchatError(f"could not read model catalog {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecchatError(f"{path}: not UTF-8 text (byte {e.start}); save the catalog as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecchatError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib recurses into nested arrays and tables
        raise SpecchatError(f"{path}: invalid TOML: nested too deeply") from None
    return parse_catalog(data, path, text, base)


_KNOWN = {
    "catalog": ("default_pair", "models", "pairs"),
    "model": ("title", "file", "quantization", "size", "sha256", "path", "hf", "pypi"),
    "hf": ("repo", "file"),
    "pypi": ("package", "version", "parts", "member", "sha256"),
    "pair": ("target", "draft", "note"),
}
_MAX_PARTS = 10_000  # building the requirement list must stay cheap; real models have tens


class _Source:
    """The catalog being read: checks values and makes one-line errors naming file, line and key."""

    def __init__(self, path: Path, text: str | None) -> None:
        self.path, self.text = path, text

    def error(self, keys: tuple[str, ...], problem: str) -> SpecchatError:
        return SpecchatError(f"{locate(self.path, self.text, keys)}: {dotted_key(keys)} {problem}")

    def table(self, value: Any, keys: tuple[str, ...], kind: str | None = None) -> dict[str, Any]:
        """A table; with a `kind`, one whose keys are all known (a misspelt `hf` would otherwise
        silently drop a source)."""
        if not isinstance(value, dict):
            raise self.error(keys, "must be a table")
        for field in value if kind is not None else ():
            if field not in _KNOWN[kind]:
                raise self.error((*keys, field), f"is not a known key (known: {', '.join(_KNOWN[kind])})")
        return value

    def string(self, body: dict[str, Any], keys: tuple[str, ...], field: str, default: str | None = None) -> str:
        """A non-empty string, or, given a default, an optional string (which may be empty)."""
        if default is not None:
            value = body.get(field, default)
            if not isinstance(value, str):
                raise self.error((*keys, field), f"must be a string, got {value!r}")
            return value
        value = body.get(field)
        if not isinstance(value, str) or not value:
            raise self.error((*keys, field), "must be a non-empty string" + (f", got {value!r}" if field in body else
                                                                              " (it is missing)"))
        return value

    def sha256(self, body: dict[str, Any], keys: tuple[str, ...]) -> str:
        sha = self.string(body, keys, "sha256").lower()
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise self.error((*keys, "sha256"), f"must be 64 hex digits, got {sha!r}")
        return sha

    def positive_int(self, body: dict[str, Any], keys: tuple[str, ...], field: str, limit: int = 0) -> int:
        value = body.get(field)
        # bool is an int subclass: `size = true` must not read as 1.
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (limit and value > limit):
            raise self.error((*keys, field), f"must be {f'1 to {limit}' if limit else 'a positive integer'}, "
                                             f"got {value!r}")
        return value


def parse_catalog(data: dict[str, Any], path: Path, text: str | None = None, base: Catalog | None = None) -> Catalog:
    """The catalog in `data`, read from `path`, extending `base` if given; given the file's `text`,
    errors name the line."""
    src = _Source(path, text)
    src.table(data, (), "catalog")
    models = dict(base.models) if base else {}
    models.update({name: _model(src, name, body)
                   for name, body in src.table(data.get("models", {}), ("models",)).items()})
    pairs = dict(base.pairs) if base else {}
    for name, body in src.table(data.get("pairs", {}), ("pairs",)).items():
        keys = ("pairs", name)
        body = src.table(body, keys, "pair")
        pair = Pair(name, src.string(body, keys, "target"), src.string(body, keys, "draft") if "draft" in body else None,
                    src.string(body, keys, "note", ""))
        for role in ("target", "draft") if pair.draft is not None else ("target",):
            if getattr(pair, role) not in models:
                raise src.error((*keys, role), f"names unknown model {getattr(pair, role)!r}")
        pairs[name] = pair
    default = data.get("default_pair", base.default_pair if base else None)
    # A TOML array or table is unhashable: test the type before looking it up.
    if not isinstance(default, str) or default not in pairs:
        raise src.error(("default_pair",), f"must name one of the [pairs.*] tables, got {default!r}")
    return Catalog(models, pairs, default)


def _model(src: _Source, name: str, body: Any) -> ModelEntry:
    keys = ("models", name)
    body = src.table(body, keys, "model")
    path = Path(src.string(body, keys, "path")).expanduser() if "path" in body else None
    file = src.string(body, keys, "file", path.name if path is not None else None)
    if not _plain_file_name(file):
        raise src.error((*keys, "file"), f"must be a plain file name ending in .gguf, got {file!r}")
    size = src.positive_int(body, keys, "size") if "size" in body else None
    hf = pypi = None
    if "hf" in body:
        t = src.table(body["hf"], (*keys, "hf"), "hf")
        hf = HfSource(src.string(t, (*keys, "hf"), "repo"), src.string(t, (*keys, "hf"), "file"))
    if "pypi" in body:
        pypi = _pypi(src, (*keys, "pypi"), body["pypi"])
    sha = src.sha256(body, keys) if "sha256" in body else None
    return ModelEntry(name, src.string(body, keys, "title", name), file, src.string(body, keys, "quantization", "?"),
                      size, hf, pypi, path, sha)


def _plain_file_name(file: str) -> bool:
    """The name becomes a path inside the models directory, so it must not leave it: one
    component on POSIX and on Windows (no `/`, `\\`, drive), not `.`/`..`, no NUL (which
    open() refuses with a ValueError, not a clean error)."""
    return (PurePosixPath(file).name == file and PureWindowsPath(file).name == file
            and file not in (".", "..") and "\0" not in file and file.endswith(".gguf"))


def _pypi(src: _Source, keys: tuple[str, ...], value: Any) -> PypiSource:
    t = src.table(value, keys, "pypi")
    parts = src.positive_int(t, keys, "parts", _MAX_PARTS)
    sha = src.sha256(t, keys)
    fields = {field: src.string(t, keys, field) for field in ("package", "version", "member")}
    for field in ("package", "member"):
        try:
            fields[field].format(n=1, i=0)  # formatting fails or not by type, not by value
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
            raise src.error((*keys, field), f"has a bad placeholder ({type(e).__name__}: {e}); "
                                            "use {n} or {i}") from None
    return PypiSource(fields["package"], fields["version"], parts, fields["member"], sha)
