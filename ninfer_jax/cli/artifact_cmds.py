"""Artifact commands: convert, inspect-artifact, count-tokens, init-random.

Thin wrappers: each parses options, calls ninfer_jax.artifact / ninfer_jax.text, and turns
ArtifactError and friends into Click errors. count-tokens never imports jax.
"""
from __future__ import annotations

import click

from ninfer_jax.errors import ArtifactError


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.command()
@click.argument("src", type=click.Path(exists=True))
@click.argument("out", type=click.Path())
@click.option("--name", default=None, help="Public model name stored in metadata.json.")
@click.option("--dtype", default="f32", show_default=True, type=click.Choice(["f32", "bf16"]),
              help="Storage dtype of the float weight matrices (norms stay f32).")
@click.option("--force", is_flag=True, help="Replace OUT if it already exists.")
@click.option("--quiet", is_flag=True, help="No per-tensor progress on stderr.")
def convert(src, out, name, dtype, force, quiet):
    """Convert a GGUF file or a Hugging Face checkpoint directory SRC into the .ninfer
    artifact OUT (written atomically)."""
    from ninfer_jax.artifact import convert as converter
    from ninfer_jax.artifact.convert_common import stderr_progress

    try:
        path = converter.convert(src, out, name=name, dtype=dtype, overwrite=force,
                                 progress=None if quiet else stderr_progress)
    except (ArtifactError, FileExistsError, ValueError) as exc:
        raise _fail(exc) from None
    click.echo(f"wrote {path}")


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
