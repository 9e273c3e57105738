"""Artifact commands: convert, inspect-artifact, count-tokens, init-random (being written)."""
from __future__ import annotations

import click


@click.command()
def convert():
    """Convert a GGUF file or a Hugging Face checkpoint into a .ninfer artifact."""
    raise click.ClickException("not written yet")


@click.command("inspect-artifact")
def inspect_artifact():
    """Show an artifact's metadata and tensor inventory."""
    raise click.ClickException("not written yet")


@click.command("count-tokens")
def count_tokens():
    """Count the prompt tokens of a text or a chat."""
    raise click.ClickException("not written yet")


@click.command("init-random")
def init_random():
    """Write an artifact with random weights."""
    raise click.ClickException("not written yet")
