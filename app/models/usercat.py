"""Changing the user's catalog (`models.toml` in the config dir): add and forget models, record pairs.

Edits go through tomlkit, so the user's own comments and order survive, and every edit is
checked by reading the result as a catalog (over the shipped one) before it is written, in
one atomic rename: a bad edit is an error, never a catalog that no longer loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Table

from specchat.errors import SpecchatError
from specchat.models.catalog import Catalog, load_catalog, parse_catalog, shipped_catalog_path, user_catalog_path
from specchat.store.files import atomic_write

HEADER = """\
# Your models and pairs. specchat reads this after its own catalog: entries here are added to it,
# and replace its entries of the same name. `specchat add`, `pair` and `remove` edit this file.
"""


class UserCatalog:
    """The user catalog as an editable document."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None and os.environ.get("SPECCHAT_CATALOG"):
            raise SpecchatError("SPECCHAT_CATALOG names the only catalog specchat reads; edit that file, or unset "
                                "it to keep your models in the user catalog")
        self.path = path or user_catalog_path()
        try:
            self.doc = tomlkit.parse(self.path.read_text(encoding="utf-8")) if self.path.is_file() \
                else tomlkit.parse(HEADER)
        except (OSError, UnicodeDecodeError, tomlkit.exceptions.ParseError) as e:
            raise SpecchatError(f"{self.path}: cannot be edited ({e}); fix or move it and try again") from None

    def _table(self, key: str) -> Table:
        if key not in self.doc:
            self.doc.add(key, tomlkit.table(is_super_table=True))
        return self.doc[key]  # type: ignore[return-value]

    def add_model(self, name: str, fields: dict[str, Any]) -> None:
        table = tomlkit.table()
        for key, value in fields.items():
            if isinstance(value, dict):  # a source: one line, as in the shipped catalog
                value, source = tomlkit.inline_table(), value
                value.update(source)
            if value is not None:
                table.add(key, value)
        self._table("models")[name] = table

    def remove_model(self, name: str) -> list[str]:
        """Forget a model, and the pairs of this file that use it; returns those pairs' names."""
        models = self.doc.get("models", {})
        if name not in models:
            raise SpecchatError(f"{name} is not in your catalog ({self.path}); `specchat models` lists what is")
        del models[name]
        pairs = self.doc.get("pairs", {})
        gone = [p for p, body in pairs.items() if name in (body.get("target"), body.get("draft"))]
        for pair in gone:
            del pairs[pair]
        if self.doc.get("default_pair") in gone:
            del self.doc["default_pair"]
        return gone

    def add_pair(self, name: str, target: str, draft: str | None, note: str = "") -> None:
        table = tomlkit.table()
        table.add("target", target)
        if draft is not None:
            table.add("draft", draft)
        if note:
            table.add("note", note)
        self._table("pairs")[name] = table

    def catalog(self) -> Catalog:
        """The catalog this document would make, over the shipped one (raises if it is invalid)."""
        text = tomlkit.dumps(self.doc)
        return parse_catalog(tomlkit.parse(text).unwrap(), self.path, text, load_catalog(shipped_catalog_path()))

    def save(self) -> Catalog:
        catalog = self.catalog()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, tomlkit.dumps(self.doc))
        return catalog
