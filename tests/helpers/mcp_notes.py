"""A notes server written with the MCP SDK, served over stdio: one tool, `read_note`, as a user's own notes
server would have. `specchat generate --tools` runs it in tests/mcptools/test_generate.py."""

from __future__ import annotations

from pathlib import Path

from mcp.server.mcpserver import MCPServer

SCRIPT = str(Path(__file__).resolve())
# What `read_note` gives for any name: a paragraph an answer can quote, which prompt lookup then copies.
NOTE = ("The launch review moved to Thursday at 10:30 in room 4B. Bring the signed budget sheet, the test "
        "report from the second run, and the list of open issues. Maria chairs; Tom takes notes.")

if __name__ == "__main__":
    server = MCPServer("notes")

    @server.tool()
    def read_note(name: str) -> str:
        """Read one of the user's notes by its name."""
        return NOTE

    server.run()
