"""The Click options of `ninfer serve`, built from the ServeConfig declarations.

`click_options()` lists one click.Option per declared field (serve/config.py), in field
order, plus --api-key-file; `build_config(artifact, params)` turns the parsed values into a
ServeConfig, checking what spans several options; `parse_serve_args(artifact, args)` does
both for an argument list (`ninfer replay` runs its local server from the same flags).
"""
from __future__ import annotations

import dataclasses

import click

from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.serve.config import SamplingOverrides, ServeConfig, option_of

API_KEY_FILE = click.Option(
    ["--api-key-file"], default=None, type=click.Path(exists=True, dir_okay=False),
    help="Read the API key from this file (its first line).")
_SAMPLING = [f.name for f in dataclasses.fields(SamplingOverrides)]


def _click_type(spec, default):
    if spec.choices is not None:
        return click.Choice(list(spec.choices))
    if spec.path is not None:
        return click.Path(exists=spec.path == "existing", dir_okay=False)
    kind = spec.type or type(default)
    if kind is int and (spec.min is not None or spec.max is not None):
        return click.IntRange(spec.min, spec.max)
    if kind is float and (spec.min is not None or spec.max is not None):
        return click.FloatRange(spec.min, spec.max)
    return kind


def _option(field: dataclasses.Field) -> click.Option:
    spec = option_of(field)
    flag = spec.flag or "--" + field.name.replace("_", "-")
    default = field.default
    if spec.is_flag:
        return click.Option([flag, field.name], is_flag=True, flag_value=spec.flag_value,
                            default=default, help=spec.help)
    if isinstance(default, tuple):  # a comma-separated list on the command line
        default = ",".join(default)
    return click.Option([flag, field.name], default=default, type=_click_type(spec, default),
                        help=spec.help, envvar=spec.envvar, show_envvar=spec.envvar is not None,
                        show_default=default is not None and default != "")


def _declared(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if option_of(f) is not None]


def click_options() -> list[click.Option]:
    options = []
    for field in _declared(ServeConfig):
        options.append(_option(field))
        if field.name == "api_key":
            options.append(API_KEY_FILE)
    at = next(i for i, o in enumerate(options) if o.name == "log_level") + 1
    options[at:at] = [_option(f) for f in _declared(SamplingOverrides)]
    return options


def _kv_capacity(value: str | None):
    if value is None or value == "auto":
        return value
    try:
        tokens = int(value)
    except ValueError:
        raise click.BadParameter("expected a token count or 'auto'",
                                 param_hint="--kv-capacity") from None
    if tokens <= 0:
        raise click.BadParameter("must be positive", param_hint="--kv-capacity")
    return tokens


def _tensor_parallel(value) -> int | str:
    if value == "auto":
        return value
    try:
        size = int(value)
    except ValueError:
        raise click.BadParameter("expected a device count or 'auto'",
                                 param_hint="--tensor-parallel") from None
    if size < 1:
        raise click.BadParameter("must be at least 1", param_hint="--tensor-parallel")
    return size


def _api_key(value: str | None, path: str | None) -> str | None:
    if value is not None and not value.strip():
        # `--api-key "$KEY"` with KEY unset would otherwise serve without authentication.
        raise click.BadParameter("is empty (an unset variable?); omit it to serve without a "
                                 "key", param_hint="--api-key")
    if path is None:
        return value
    if value:
        raise click.UsageError("give the API key once: --api-key (or NINFER_API_KEY) or "
                               "--api-key-file, not both")
    with open(path, encoding="utf-8") as handle:
        key = handle.readline().strip()
    if not key:
        raise click.BadParameter(f"{path} holds no key on its first line",
                                 param_hint="--api-key-file")
    return key


def build_config(artifact: str, params: dict, argv: tuple[str, ...] = ()) -> ServeConfig:
    """A ServeConfig from parsed option values (raises Click's usage errors)."""
    params = dict(params)
    sampling = SamplingOverrides(**{name: params.pop(name) for name in _SAMPLING})
    try:
        speculative = SpeculativeConfig.from_options(params["spec"], params["draft_tokens"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    kv_tokens = _kv_capacity(params.pop("kv_capacity"))
    if isinstance(kv_tokens, int) and kv_tokens < params["max_context"]:
        raise click.BadParameter(
            f"{kv_tokens} tokens is less than --max-context {params['max_context']}: one "
            "request at the full context could never fit; raise it, use 'auto', or lower "
            "--max-context", param_hint="--kv-capacity")
    hosts = params.pop("allowed_hosts")
    params.update(
        api_key=_api_key(params.pop("api_key"), params.pop("api_key_file")),
        allowed_hosts=tuple(h.strip() for h in hosts.split(",") if h.strip()),
        draft_tokens=speculative.draft_tokens if speculative else None,
        tensor_parallel=_tensor_parallel(params.pop("tensor_parallel")))
    return ServeConfig(artifact=artifact, kv_capacity=kv_tokens, sampling=sampling,
                       argv=tuple(argv), **params)


def parse_serve_args(artifact: str, args: list[str]) -> ServeConfig:
    """The ServeConfig `ninfer serve ARTIFACT ARGS...` would build."""
    command = click.Command("serve", params=click_options())
    with command.make_context("serve", list(args)) as ctx:
        return build_config(artifact, ctx.params, argv=("ninfer", "serve", artifact, *args))
