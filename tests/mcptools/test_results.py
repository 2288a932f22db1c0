"""What a tool call gives the model: content as text, a cap on size, failures in one line."""

from __future__ import annotations

import base64

from mcp_types import EmbeddedResource, ImageContent, ResourceLink, TextContent, TextResourceContents

from specchat.mcptools.results import ToolResult, capped, content_text


def test_a_result_over_the_cap_is_cut_on_a_character_boundary_with_a_line_saying_how_much():
    text = "é" * 10  # two bytes each: a cut at 5 bytes falls inside the third
    result = capped(text, limit=5)
    assert result == ToolResult("éé\n[result cut: 16 of its 20 bytes left out, over the 0 KiB limit]", cut=16)
    assert capped(text, limit=20) == ToolResult(text)


def test_a_megabyte_in_one_line_is_cut_too():
    result = capped("x" * (1 << 20))
    assert result.cut == (1 << 20) - 256 * 1024 and len(result.text.encode()) < 256 * 1024 + 100


def test_text_is_joined_and_other_content_named_in_a_line_each():
    png = base64.b64encode(bytes(10)).decode()  # 10 bytes: base64 pads them to 16 characters
    content = [TextContent(text="first"), ImageContent(data=png, mime_type="image/png"),
               EmbeddedResource(resource=TextResourceContents(uri="file:///n.txt", text="a note")),
               ResourceLink(uri="file:///big.bin", name="big")]
    assert content_text(content) == ("first\n[image (image/png, 10 bytes) not shown]\na note\n"
                                     "[link to resource file:///big.bin]")


def test_a_failure_is_one_line():
    assert ToolResult.failed("Traceback:\n  File x\nValueError: no") == ToolResult("Traceback: File x ValueError: no",
                                                                                   error=True)
    assert len(ToolResult.failed("y" * 10_000).text) == 500
