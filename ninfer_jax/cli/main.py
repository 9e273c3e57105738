"""The `ninfer` command group. Each command is a thin Click wrapper in its own module that
builds a config and calls the library; heavy imports (jax) happen inside the commands."""
from __future__ import annotations

import click

from ninfer_jax.cli.artifact_cmds import convert, count_tokens, init_random, inspect_artifact
from ninfer_jax.cli.replay import replay
from ninfer_jax.cli.serve import serve


@click.group()
def main() -> None:
    """ninfer-jax: an LLM inference server compiled by JAX/XLA."""


for command in (serve, convert, inspect_artifact, count_tokens, init_random, replay):
    main.add_command(command)

if __name__ == "__main__":
    main()
