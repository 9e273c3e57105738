"""Artifact commands: convert, inspect-artifact, count-tokens, init-random.

Thin wrappers: each parses options, calls ninfer_jax.artifact / ninfer_jax.text, and turns
ArtifactError and friends into Click errors. count-tokens never imports jax.
"""
from __future__ import annotations

import click

from ninfer_jax.artifact.random_init import PRESETS, TINY_DIMS  # numpy + tokenizers, no jax
from ninfer_jax.errors import ArtifactError


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def _check_output(out: str, force: bool) -> None:
    """Refuse an OUT that cannot be written before any weight is read or built (a conversion
    can take minutes): it exists without --force, or its nearest existing parent is not a
    writable directory (save_artifact creates the missing ones)."""
    import os
    import pathlib

    path = pathlib.Path(out).absolute()
    if path.exists() and not force:
        raise click.ClickException(f"{out} already exists (pass --force to replace it)")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise click.BadParameter(f"cannot write {out}: {parent} is not a directory",
                                 param_hint="OUT")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.BadParameter(f"cannot write {out}: {parent} is not writable",
                                 param_hint="OUT")


def _write_failed(out: str, exc: OSError) -> click.ClickException:
    where = f" ({exc.filename})" if exc.filename else ""
    return click.ClickException(f"cannot write {out}: {exc.strerror or exc}{where}")


WEIGHT_CHOICES = ["f32", "bf16", "int8", "fp8", "int4", "nvfp4"]
CONVERT_WEIGHT_CHOICES = WEIGHT_CHOICES + ["gguf"]


@click.command()
@click.argument("src", type=click.Path(exists=True))
@click.argument("out", type=click.Path())
@click.option("--name", default=None, help="Public model name stored in metadata.json.")
@click.option("--dtype", default=None, type=click.Choice(["f32", "bf16"]),
              help="Storage dtype of float weights (default f32; norms always stay f32).")
@click.option("--weights", default=None, type=click.Choice(CONVERT_WEIGHT_CHOICES),
              help="Format of the projection matrices (default: --dtype); gguf keeps a GGUF's "
                   "q8_0/q4_0/q4_1 blocks as stored, for the CPU block kernel.")
@click.option("--dflash", "dflash", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A public DFlash or DFlash2 drafter checkpoint directory (z-lab layout: "
                   "config.json, *.safetensors) to add as the dflash / dflash2 component; "
                   "repeatable.")
@click.option("--lm-head-draft-vocab", default=0, type=click.IntRange(0),
              help="Add the reduced proposal head of --lm-head-draft: the lm_head kept for "
                   "token ids 0..N-1.")
@click.option("--force", is_flag=True, help="Replace OUT if it already exists.")
@click.option("--quiet", is_flag=True, help="No per-tensor progress on stderr.")
def convert(src, out, name, dtype, weights, dflash, lm_head_draft_vocab, force, quiet):
    """Convert a GGUF file or a Hugging Face checkpoint directory SRC into the .ninfer
    artifact OUT (written atomically). SRC may be a .ninfer artifact to add drafter
    components (--dflash, --lm-head-draft-vocab) to it."""
    from ninfer_jax.artifact import convert as converter
    from ninfer_jax.artifact.convert_common import stderr_progress

    _check_output(out, force)
    try:
        path = converter.convert(src, out, name=name, dtype=dtype, weights=weights,
                                 overwrite=force, progress=None if quiet else stderr_progress,
                                 dflash=dflash, draft_head_vocab=lm_head_draft_vocab)
    except (ArtifactError, FileExistsError, ValueError) as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise _write_failed(out, exc) from None
    click.echo(f"wrote {path}")


@click.command("init-random")
@click.option("--preset", required=True, type=click.Choice(list(PRESETS)),
              help="Architecture, shape, vocabulary and template (docs/artifact-format.md).")
@click.argument("out", type=click.Path())
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of the random weights.")
@click.option("--dtype", default=None, type=click.Choice(["f32", "bf16"]),
              help="Storage dtype of float weights (default: f32 for tiny presets, bf16 "
                   "for full-size ones).")
@click.option("--weights", default=None, type=click.Choice(WEIGHT_CHOICES),
              help="Format of the projection matrices (default: --dtype).")
@click.option("--tiny", is_flag=True,
              help=f"Tiny dimensions (hidden {TINY_DIMS['hidden_size']}, "
                   f"{TINY_DIMS['num_layers']} layers, {TINY_DIMS['num_heads']} query heads) "
                   "with everything else of the preset: architecture, vocabulary, special "
                   "tokens, chat template and format, qk-norm, tying, RoPE, head grouping.")
@click.option("--name", default=None, help="Public model name (default: the preset).")
@click.option("--drafters/--no-drafters", default=None,
              help="Add random DFlash and DFlash2 drafters and a reduced proposal head: "
                   "hybrid presets (default: with tiny dimensions only) and dense llama / "
                   "qwen3 ones (only when given).")
@click.option("--force", is_flag=True, help="Replace OUT if it already exists.")
@click.option("--quiet", is_flag=True, help="No per-tensor progress on stderr.")
def init_random(preset, out, seed, dtype, weights, tiny, name, drafters, force, quiet):
    """Write an artifact with random weights, a real tokenizer built offline (Qwen3, Qwen3.5,
    or a Llama-3-layout stand-in) and our own chat template (tiny presets for tests, published
    dense and hybrid shapes for GPU benchmarks; hybrid presets include their MTP head and
    random DFlash / DFlash2 drafters)."""
    from ninfer_jax.artifact.convert_common import stderr_progress
    from ninfer_jax.artifact.format import save_artifact
    from ninfer_jax.artifact.random_init import init_random as build

    _check_output(out, force)
    try:
        contents = build(preset, seed=seed, dtype=dtype, weights=weights, name=name, tiny=tiny,
                         progress=None if quiet else stderr_progress,
                         drafters=drafters)
        path = save_artifact(out, contents, overwrite=force)
    except (ArtifactError, FileExistsError, ValueError) as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise _write_failed(out, exc) from None
    click.echo(f"wrote {path}")


@click.command("inspect-artifact")
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect_artifact(path, as_json):
    """Show an artifact's metadata, components and tensor inventory."""
    import json

    from ninfer_jax.artifact.inventory import describe_artifact, format_report

    try:
        report = describe_artifact(path)
    except ArtifactError as exc:
        raise _fail(exc) from None
    click.echo(json.dumps(report, indent=2, ensure_ascii=False) if as_json
               else format_report(report))


@click.command("count-tokens")
@click.argument("artifact", required=False, type=click.Path())
@click.option("--text", default=None, help="Count this text (as one user message unless "
                                           "--no-template).")
@click.option("--messages", "messages_file", default=None, type=click.File("r"),
              help="JSON file ('-' for stdin): a list of chat messages, or an object with "
                   "'messages' and optional 'tools'.")
@click.option("--no-template", is_flag=True, help="Count --text as raw text, no chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print {count, ids} as JSON.")
def count_tokens(artifact, text, messages_file, no_template, as_json):
    """Count prompt tokens offline with ARTIFACT's tokenizer and chat template (default: the
    embedded default model). Renders with the generation prompt, as the server does."""
    import json

    from ninfer_jax.artifact.default_model import default_artifact_path
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.errors import NinferError

    if (text is None) == (messages_file is None):
        raise click.UsageError("give exactly one of --text and --messages")
    if no_template and text is None:
        raise click.UsageError("--no-template applies to --text only")
    try:
        loaded = load_artifact(artifact or default_artifact_path(), weights=False)
        tokenizer = loaded.load_tokenizer()
        if no_template:
            ids = tokenizer.encode(text)
        else:
            ids = _render_ids(loaded, tokenizer, text, messages_file)
    except (ArtifactError, NinferError) as exc:
        raise _fail(exc) from None
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"--messages is not valid JSON ({exc})") from None
    click.echo(json.dumps({"count": len(ids), "ids": ids}) if as_json else str(len(ids)))


def _render_ids(artifact, tokenizer, text, messages_file) -> list[int]:
    import json

    from ninfer_jax.serve.openai.chat_messages import parse_messages, parse_tools
    from ninfer_jax.text.chat_template import ChatRenderer
    from ninfer_jax.text.conversation import Conversation

    if text is not None:
        raw_messages, raw_tools = [{"role": "user", "content": text}], None
    else:
        data = json.load(messages_file)
        if isinstance(data, dict):
            raw_messages, raw_tools = data.get("messages"), data.get("tools")
        else:
            raw_messages, raw_tools = data, None
    conversation = Conversation(parse_messages(raw_messages, vision=True),
                                tools=parse_tools(raw_tools) if raw_tools else [])
    renderer = ChatRenderer(artifact.chat_template, tokenizer, artifact.chat_format)
    if not conversation.media:
        return renderer.render(conversation).ids
    if not artifact.components.get("vision"):
        raise click.ClickException(
            f"{conversation.media[0].param}: {artifact.path} has no vision component, so "
            "media cannot be counted (its server refuses them with vision_disabled)")
    # Media parts count as the server counts them: prepared, their placeholders expanded.
    from ninfer_jax.serve.media.intake import MediaIntake
    from ninfer_jax.serve.media.preprocess import VisionProcessing

    intake = MediaIntake(VisionProcessing.from_metadata(artifact.metadata), cache_mib=0,
                         live_mib=1 << 20, threads=1, max_source_bytes=1 << 31)
    batch = intake.prepare(conversation.media)
    try:
        return renderer.render(conversation,
                               media=[item.layout() for item in batch.items]).ids
    finally:
        batch.release()
        intake.close()
