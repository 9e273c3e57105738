"""`ninfer serve [ARTIFACT]`: the options declared by ServeConfig (serve/options.py), then the
launcher."""
from __future__ import annotations

import sys

import click

from ninfer_jax.serve.options import build_config, click_options


@click.command(params=[click.Argument(["artifact"], required=False), *click_options()])
def serve(artifact, **options):
    """Serve ARTIFACT (default: the embedded SmolLM2-135M-Instruct) over HTTP."""
    from ninfer_jax.artifact.default_model import default_artifact_path
    from ninfer_jax.serve.launcher import run_server

    config = build_config(str(artifact or default_artifact_path()), options, argv=sys.argv)
    run_server(config)
