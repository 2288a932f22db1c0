"""The key line at the bottom of a screen: its keys, those that would do nothing now dimmed, in one widget.

Textual's Footer makes a widget of every key. Every layout of the screen (one a second or more while an
answer streams) arranges each of them, and it builds them all again whenever a key is enabled or disabled,
which the chat does at every answer's start and end: together a tenth of what the screen cost the decoding
on a small CPU. This draws the same line as one widget, and a click on a key presses it, as there.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget


class KeyLine(Widget):
    COMPONENT_CLASSES = {"keyline--key", "keyline--description"}
    DEFAULT_CSS = """
    KeyLine {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
        text-wrap: nowrap;
        .keyline--key { color: $footer-key-foreground; background: $footer-key-background; text-style: bold; }
        .keyline--description { color: $footer-description-foreground; background: $footer-description-background; }
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._keys: list[tuple[int, int, Binding, bool]] = []  # each key's columns, binding and whether it acts

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def _bindings_changed(self, screen: Screen) -> None:
        self.refresh()  # one line, always: no layout

    def _shown(self) -> tuple[list[tuple[Binding, bool]], tuple[Binding, bool] | None]:
        """The keys to show (one per action, in order) and the command palette's, apart: it goes on the right."""
        palette = None
        keys: dict[str, tuple[Binding, bool]] = {}
        for _, binding, enabled, _ in self.screen.active_bindings.values():
            if binding.key == self.app.COMMAND_PALETTE_BINDING and self.app.ENABLE_COMMAND_PALETTE:
                palette = binding, enabled
            elif binding.show:
                keys.setdefault(binding.action, (binding, enabled))
        return list(keys.values()), palette

    def render(self) -> Text:
        key_style, description_style = (self.get_component_rich_style(f"keyline--{part}") for part in ("key", "description"))
        keys, palette = self._shown()
        self._keys = []

        def entry(binding: Binding, enabled: bool, label: str, at: int) -> Text:
            text = Text.assemble((f" {self.app.get_key_display(binding)} ", key_style), (f"{label} ", description_style))
            if not enabled:
                text.stylize("dim")
            self._keys.append((at, at + text.cell_len, binding, enabled))
            return text

        line = Text(no_wrap=True, overflow="crop")
        for binding, enabled in keys:
            line.append_text(entry(binding, enabled, binding.description, line.cell_len))
        if palette is not None:  # on the right, always there: the keys that do not fit give way
            binding, enabled = palette
            at = max(0, self.size.width - (len(self.app.get_key_display(binding)) + len(binding.description or "palette") + 3))
            line.truncate(at, pad=True)
            self._keys = [key for key in self._keys if key[1] <= at]
            line.append_text(entry(binding, enabled, binding.description or "palette", at))
        return line

    def on_click(self, event: events.Click) -> None:
        for start, end, binding, enabled in self._keys:
            if start <= event.x < end:
                if enabled:
                    self.app.simulate_key(binding.key)
                else:
                    self.app.bell()
                return
