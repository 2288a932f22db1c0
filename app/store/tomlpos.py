"""Where a key is written in a TOML file, for error messages that point at the line to fix.

tomllib returns plain dicts and keeps no positions, so a value that parses but is wrong (a
file name that leaves the models directory, a negative size) could only be reported by its
dotted key. This module scans the text once more for just the things that decide where a key
is written: table headers, keys, and the strings, comments and brackets that could hide or
imitate them. It is not a parser. It is meant for text tomllib has accepted; on anything else
it still returns (a line or None) and never raises, because it only ever decorates an error.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPE = re.compile(r'\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))', re.DOTALL)
_SCALAR = re.compile(r"[^,\]}\n#]*")  # a number, boolean or date (which may hold a space)
_SIMPLE_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def key_line(text: str, path: Sequence[str]) -> int | None:
    """The 1-based line where the key `path` (e.g. ("models", "qwen", "file")) is written.

    A key that is not written anywhere (a missing key, or one inside something the scanner
    does not follow, such as an array) gives the line of its nearest enclosing table or key
    that is: `[models.qwen]`, or `pypi = {...}`, or the first `pypi.x = ...` line of a table
    that only dotted keys define. None when not even the first part of the path is written.
    """
    wanted = tuple(path)
    best: tuple[int, bool] | None = None
    best_line: int | None = None
    for line, keys in _definitions(text):
        if keys == wanted:
            return line
        shared = len(os.path.commonprefix([keys, wanted]))  # of keys: it compares any sequences
        if shared == 0:
            continue
        # Prefer more of the path; at equal length, a table that encloses the key over a sibling.
        score = (shared, shared == len(keys))
        if best is None or score > best:
            best, best_line = score, line
    return best_line


def _definitions(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """(line, full key path) of every table header and key, in file order."""
    scanner = _Scanner(text)
    try:
        scanner.document()
    except (_Stop, IndexError, ValueError, RecursionError):
        pass  # malformed or unexpected text: what was found before it still holds
    return scanner.found


class _Stop(Exception):
    """The scanner met text it does not understand."""


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line = text, 0, 1
        self.found: list[tuple[int, tuple[str, ...]]] = []

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos:self.pos + n]

    def advance(self, n: int = 1) -> None:
        self.line += self.text.count("\n", self.pos, self.pos + n)
        self.pos += n

    def blank(self, newlines: bool) -> None:
        """Skip spaces and comments, and newlines too where the grammar allows them."""
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t" or (newlines and c in "\r\n"):
                self.advance()
            elif c == "#":
                end = self.text.find("\n", self.pos)
                self.advance((len(self.text) if end < 0 else end) - self.pos)
            else:
                return

    def document(self) -> None:
        table: tuple[str, ...] = ()
        while True:
            self.blank(newlines=True)
            if self.pos >= len(self.text):
                return
            line = self.line
            if self.peek() == "[":
                double = self.peek(2) == "[["
                self.advance(2 if double else 1)
                table = self.key()
                self.expect("]]" if double else "]")
                self.found.append((line, table))
            else:
                keys = table + self.key()
                self.found.append((line, keys))
                self.expect("=")
                self.value(keys)

    def key(self) -> tuple[str, ...]:
        """A dotted key: bare or quoted parts separated by dots, spaces allowed around the dots."""
        parts = []
        while True:
            self.blank(newlines=False)
            parts.append(self.simple_key())
            self.blank(newlines=False)
            if self.peek() != ".":
                return tuple(parts)
            self.advance()

    def simple_key(self) -> str:
        c = self.peek()
        if c in ('"', "'"):
            return self.string()
        match = _BARE.match(self.text, self.pos)
        if not match:
            raise _Stop
        self.advance(match.end() - self.pos)
        return match.group()

    def expect(self, token: str) -> None:
        self.blank(newlines=False)
        if self.peek(len(token)) != token:
            raise _Stop
        self.advance(len(token))

    def value(self, keys: tuple[str, ...] | None) -> None:
        """Skip one value; record the keys of inline tables under `keys` (None inside arrays,
        whose tables have no dotted path)."""
        self.blank(newlines=False)
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":
            self.advance()
            while True:
                self.blank(newlines=True)
                if self.peek() in ("]", ""):
                    break
                self.value(None)
                self.blank(newlines=True)
                if self.peek() == ",":
                    self.advance()
            self.expect("]")
        elif c == "{":
            self.advance()
            while True:
                self.blank(newlines=False)
                if self.peek() in ("}", ""):
                    break
                line, sub = self.line, self.key()
                if keys is not None:
                    self.found.append((line, keys + sub))
                self.expect("=")
                self.value(None if keys is None else keys + sub)
                self.blank(newlines=False)
                if self.peek() == ",":
                    self.advance()
            self.expect("}")
        else:
            match = _SCALAR.match(self.text, self.pos)
            if match is None or not match.group().strip():
                raise _Stop
            self.advance(match.end() - self.pos)

    def string(self) -> str:
        """Any of TOML's four string forms; returns the value (escapes decoded in basic strings)."""
        quote = self.peek()
        if self.peek(3) == quote * 3:
            self.advance(3)
            end = self.text.find(quote * 3, self.pos) if quote == "'" else self._basic_end(quote * 3)
            if end < 0:
                raise _Stop
            # Up to two quotes may directly precede the closing three and belong to the string.
            while self.text.startswith(quote, end + 3) and end + 3 < len(self.text):
                end += 1
            raw = self.text[self.pos:end]
            self.advance(end + 3 - self.pos)
        else:
            self.advance()
            end = self.text.find("'", self.pos) if quote == "'" else self._basic_end('"')
            if end < 0 or "\n" in self.text[self.pos:end]:
                raise _Stop
            raw = self.text[self.pos:end]
            self.advance(end + 1 - self.pos)
        return raw if quote == "'" else _unescape(raw)

    def _basic_end(self, close: str) -> int:
        """Index of the unescaped `close` after self.pos in a basic string, or -1."""
        i = self.pos
        while i < len(self.text):
            if self.text[i] == "\\":
                i += 2
            elif self.text.startswith(close, i):
                return i
            else:
                i += 1
        return -1


def _unescape(raw: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group(1) or m.group(2)
        if code:
            return chr(int(code, 16))
        # A backslash before a newline (line-ending backslash) only occurs in multi-line strings,
        # which are never keys; keep anything unknown as written.
        return _SIMPLE_ESCAPES.get(m.group(3), m.group())
    return _ESCAPE.sub(one, raw)


def locate(file: object, text: str | None, path: Sequence[str]) -> str:
    """`file line N` for an error message about the key `path`, or just `file` if no line is known."""
    line = key_line(text, path) if text is not None else None
    return f"{file} line {line}" if line else str(file)


def dotted_key(path: Sequence[str]) -> str:
    """The key as TOML writes it: `models."qwen2.5".file`. Quoting (with escapes) keeps a name
    holding dots unambiguous and one holding a newline on one line."""
    return ".".join(k if _BARE.fullmatch(k) else _quote(k) for k in path)


def _quote(key: str) -> str:
    """A TOML basic string: control characters (which TOML forbids raw) as \\uXXXX."""
    return '"' + "".join("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f" else c
                         for c in key) + '"'
