"""The names the model calls tools by.

The rule: a tool is called by its own name, with every character OpenAI's function names do not allow
(anything but letters, digits, '_' and '-') written as '_', cut to 64 characters. Where two servers offer
tools that would get the same name, each of them is called `SERVER__TOOL` instead (the server's name written
the same way); if even that is taken, `_2`, `_3`, … is added in the order the servers are configured. The
same servers offering the same tools always get the same names, so a conversation's calls stay valid.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

MAX = 64  # OpenAI's limit on a function's name
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def safe(name: str) -> str:
    return _UNSAFE.sub("_", name)[:MAX] or "_"


def exposed_names(tools: Sequence[tuple[str, str]]) -> list[str]:
    """The name the model sees for each (server, tool), in the order given."""
    plain = [safe(tool) for _, tool in tools]
    counts = Counter(plain)
    wanted = [p if counts[p] == 1 else safe(f"{safe(server)}__{tool}") for p, (server, tool) in zip(plain, tools)]
    taken: set[str] = set()
    names = []
    for name in wanted:
        final, n = name, 1
        while final in taken:
            n += 1
            suffix = f"_{n}"
            final = name[:MAX - len(suffix)] + suffix
        taken.add(final)
        names.append(final)
    return names
