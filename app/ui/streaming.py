"""Running a generation in a worker thread and handing its events to the UI in batches.

Calling into the UI for every token would tie generation speed to drawing speed, so steps
are gathered for `interval` seconds and posted together; the last batch is always flushed.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from specchat.backend import BackendEvent, Notice
from specchat.spec.engine import Done, Prefill, Step


def pump(events: Iterable[BackendEvent], post: Callable[[Callable, object], None],
         on_steps: Callable[[list[Step]], object], on_done: Callable[[Done], object],
         on_notice: Callable[[str], object], on_prefill: Callable[[Prefill], object],
         interval: float = 0.03) -> None:
    """Consume `events` (in the worker thread) and `post(callback, arg)` them to the UI thread."""
    batch: list[Step] = []
    last = float("-inf")  # the first step is shown at once: time to first token is what users feel
    for event in events:
        if isinstance(event, Step):
            batch.append(event)
            if time.monotonic() - last >= interval:
                post(on_steps, batch)
                batch, last = [], time.monotonic()
        elif isinstance(event, Prefill):
            post(on_prefill, event)
        elif isinstance(event, Notice):
            post(on_notice, event.text)
        elif isinstance(event, Done):
            if batch:
                post(on_steps, batch)
                batch = []
            post(on_done, event)
    if batch:
        post(on_steps, batch)
