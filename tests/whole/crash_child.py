"""The process that test_crash.py kills: the real app doing real work, with no test hooks inside.

    python tests/whole/crash_child.py chat DB CONFIG PROMPT...   chat through the app on the real models
    python tests/whole/crash_child.py rewrite DOC DB CONFIG      rewrite a document in the app and save it
    python tests/whole/crash_child.py save OUT TEXTFILE...       save each text over OUT, in a loop

The app runs headless under Textual's Pilot, on the real LocalBackend and the real Store.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from specchat.service.choices import ModelChoice
from specchat.service.documents import save
from specchat.store.conversations import Store

PAIR = ModelChoice(pair="smollm2-self", n_ctx=1024)


async def until(pilot, condition, timeout: float = 120.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise TimeoutError("the app did not get there")


async def chat(db: Path, config: Path, prompts: list[str]) -> None:
    from specchat.ui.app import SpecchatApp

    app = SpecchatApp(PAIR, store=Store(db), settings_path=config)
    async with app.run_test(headless=True, size=(120, 36)) as pilot:
        await until(pilot, lambda: app.ready)
        # To the test, past anything Textual does with sys.stdout: the answers start now (so its kills
        # can be timed over the answers, whatever the load and the first measurement took).
        os.write(1, b"ready\n")
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing more: the test stops reading
        for prompt in prompts:
            app.query_one("#input").text = prompt
            await pilot.press("enter")
            await until(pilot, lambda: not app.generating)


async def rewrite(doc: Path, db: Path, config: Path) -> None:
    from specchat.ui.app import SpecchatApp
    from specchat.ui.rewrite import RewriteScreen

    app = SpecchatApp(PAIR, store=Store(db), settings_path=config, rewrite_file=doc)
    async with app.run_test(headless=True, size=(140, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RewriteScreen))
        screen = app.screen
        await pilot.press("ctrl+r")
        await until(pilot, lambda: screen.result is not None)
        await pilot.press("ctrl+s")  # saves synchronously: the file exists once the key is handled


def save_loop(out: Path, texts: list[Path]) -> None:
    contents = [t.read_text() for t in texts]
    n = 0
    while True:
        save(contents[n % len(contents)], out)
        n += 1


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "chat":
        asyncio.run(chat(Path(args[0]), Path(args[1]), args[2:]))
    elif mode == "rewrite":
        asyncio.run(rewrite(Path(args[0]), Path(args[1]), Path(args[2])))
    elif mode == "save":
        save_loop(Path(args[0]), [Path(a) for a in args[1:]])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
