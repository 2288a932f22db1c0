"""The Textual terminal app. Imports the engine side; nothing there imports this package."""
