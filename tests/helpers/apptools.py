"""The app's tools in Pilot tests: a toolbox over the SDK's test server (tests/helpers/mcp_servers.py, over stdio), F5 with
every tool ticked, and the question before a call. It imports the MCP SDK: import it after
`pytest.importorskip("mcp")`."""

from __future__ import annotations

import sys

from mcp_servers import SCRIPT
from pilot import until

from specchat.mcptools.config import McpConfig, ServerEntry
from specchat.mcptools.toolbox import Toolbox
from specchat.ui.app import SpecchatApp
from specchat.ui.tools import ToolCallScreen, ToolsScreen


def toolbox(timeout_s: float = 20.0, script: str = SCRIPT) -> Toolbox:
    """The configured servers: one, named notes, running `script` (the test server, or tests/helpers/mcp_notes.py)."""
    return Toolbox(McpConfig((ServerEntry("notes", command=sys.executable, args=(script,)),), timeout_s=timeout_s))


async def choose_all_tools(pilot, app: SpecchatApp, call_first: bool = False, timeout: float = 15.0) -> None:
    """F5, every tool ticked (and `call_first`), saved: this conversation offers them all."""
    await until(pilot, lambda: app.ready, "models to load", timeout=timeout)
    await pilot.press("f5")
    await until(pilot, lambda: isinstance(app.screen, ToolsScreen), "the tools dialog", timeout=60)
    await pilot.press("ctrl+a", *(("ctrl+t",) if call_first else ()), "enter")
    await until(pilot, lambda: app.chat.conversation.tools, "the tools chosen")


async def asked(pilot, app: SpecchatApp, timeout: float = 60.0) -> ToolCallScreen:
    await until(pilot, lambda: isinstance(app.screen, ToolCallScreen), "the question about the call", timeout=timeout)
    return app.screen  # type: ignore[return-value]
