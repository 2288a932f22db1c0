"""What a tool call gives the model: its result as text, or one line saying why there is none.

Whatever went wrong (a server that did not start, a call that timed out, a tool that raised, arguments that
were not JSON), the conversation goes on: the model gets the line as the tool's result, and the user sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

MAX_RESULT_BYTES = 256 * 1024  # more would crowd the context and slow every later prompt


@dataclass(frozen=True)
class ToolResult:
    """`text` goes to the model as the `tool` message. `error` is True when it is a line about a failure rather
    than the tool's output; `cut` counts the bytes of output left out to keep it under the size cap."""

    text: str
    error: bool = False
    cut: int = 0

    @staticmethod
    def failed(line: str) -> ToolResult:
        return ToolResult(one_line(line), error=True)


def one_line(text: str, limit: int = 500) -> str:
    """Text on one line (a traceback or a validation report folds into it), at most `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def content_text(content: Sequence[Any]) -> str:
    """A result's content blocks as text: text blocks and text resources joined by newlines; each image,
    audio clip, binary resource or link named on a line of its own (the model cannot read them as text)."""
    parts = []
    for block in content:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        elif kind == "resource":
            parts.append(f"[binary resource {block.resource.uri} ({block.resource.mime_type or 'no type'}) not shown]")
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=")  # base64's length, less its padding
            parts.append(f"[{kind} ({block.mime_type}, {size} bytes) not shown]")
        elif kind == "resource_link":
            parts.append(f"[link to resource {block.uri}]")
        else:
            parts.append(f"[{kind} content not shown]")
    return "\n".join(parts)


def capped(text: str, limit: int = MAX_RESULT_BYTES) -> ToolResult:
    """The text as a result, cut to `limit` bytes of UTF-8 (never inside a character) with a last line saying
    how much was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return ToolResult(text)
    kept = data[:limit].decode("utf-8", errors="ignore")
    cut = len(data) - len(kept.encode("utf-8"))
    return ToolResult(f"{kept}\n[result cut: {cut} of its {len(data)} bytes left out, over the {limit // 1024} KiB limit]",
                      cut=cut)
