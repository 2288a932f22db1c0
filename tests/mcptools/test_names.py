"""The names the model calls MCP tools by: their own, unless two servers share one."""

from __future__ import annotations

from specchat.mcptools.names import exposed_names


def test_a_tool_keeps_its_name_unless_another_server_has_one_of_the_same():
    assert exposed_names([("files", "read"), ("web", "fetch"), ("notes", "read")]) == [
        "files__read", "fetch", "notes__read"]


def test_characters_function_names_cannot_hold_become_underscores_and_names_stay_within_64():
    assert exposed_names([("my.server", "get weather/now"), ("x", "a" * 80)]) == ["get_weather_now", "a" * 64]
    # Two names that only differ where they were unsafe clash once written safely: the servers tell them apart.
    assert exposed_names([("s.1", "a.b"), ("s2", "a b")]) == ["s_1__a_b", "s2__a_b"]


def test_a_name_still_taken_gets_a_number_in_configured_order():
    # "a__x" is the first server's own tool name, and also what the second server's "x" would be called
    # were it prefixed; and two servers named alike once made safe.
    assert exposed_names([("a", "a__x"), ("b", "x"), ("a", "x")]) == ["a__x", "b__x", "a__x_2"]
    assert exposed_names([("s.1", "t"), ("s_1", "t")]) == ["s_1__t", "s_1__t_2"]


def test_a_numbered_name_stays_within_64_characters():
    long = "t" * 70
    assert exposed_names([("a", "a__" + long), ("a", long), ("b", long)]) == [
        "a__" + "t" * 61, "a__" + "t" * 59 + "_2", "b__" + "t" * 61]
