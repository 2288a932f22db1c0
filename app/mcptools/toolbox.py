"""The configured MCP servers as one box of tools, for a front end: started when first needed, listed, called,
and stopped. `specchat generate --tools` starts it at once; the app starts it the first time a conversation's
tools are chosen, so that nothing starts or connects unless the user asked for tools."""

from __future__ import annotations

from typing import Any, Sequence

from specchat.errors import SpecchatError
from specchat.mcptools.config import McpConfig, load_config
from specchat.mcptools.results import ToolResult


def configured() -> Toolbox:
    """The servers config.toml configures, not started yet. Raises, in one line, where the MCP SDK is not
    installed or no server is configured (each entry left out is among `config.problems`)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise SpecchatError("tools need the MCP SDK: pip install 'specchat[tools]'") from None
    config = load_config()
    if not config.servers:
        from specchat.service.settings import default_config_path

        raise SpecchatError(f"no MCP server is configured in {default_config_path()}: add one as [mcp.servers.NAME] "
                            "with command and args, or url (docs/tools.md)"
                            + (f"; left out: {'; '.join(config.problems)}" if config.problems else ""))
    return Toolbox(config)


class Toolbox:
    """The servers of `config`, through one client. `start()` may be called again: it starts them only once."""

    def __init__(self, config: McpConfig) -> None:
        # Imported here: the MCP SDK is an extra, and `configured` says so before any of it is needed.
        from specchat.mcptools.client import McpClient

        self.config, self.client = config, McpClient(config.timeout_s)
        self.started = False

    def start(self) -> list[str]:
        """Each configured server started; a line for every problem (an entry left out, a server that did not
        start: its tools are simply absent)."""
        if self.started:
            return []
        self.started = True
        return [*self.config.problems, *self.client.start(self.config.servers)]

    def described(self) -> list[tuple[str, str]]:
        """Every started server's tools: the name the model calls each by, and its description."""
        return [(s["function"]["name"], s["function"]["description"]) for s in self.client.tools()]

    def schemas(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The tools as OpenAI function schemas: all of them, or those `names` lists."""
        return [s for s in self.client.tools() if names is None or s["function"]["name"] in names]

    def call(self, name: str, arguments: str) -> ToolResult:
        return self.client.call(name, arguments)

    def server_of(self, name: str) -> str:
        return self.client.server_of(name)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
