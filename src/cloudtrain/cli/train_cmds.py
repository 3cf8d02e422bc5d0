"""Commands: filled in as the capability lands."""

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
