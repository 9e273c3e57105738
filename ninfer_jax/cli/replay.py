"""`ninfer replay`: re-send captured requests and compare outputs (being written)."""
from __future__ import annotations

import click


@click.command()
def replay():
    """Replay captured requests against a server or an artifact."""
    raise click.ClickException("not written yet")
