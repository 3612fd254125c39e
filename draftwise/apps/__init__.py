"""Command-line apps: generate, bench, chat, serve (``draftwise --help``)."""
