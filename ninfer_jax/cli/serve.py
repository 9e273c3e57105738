"""`ninfer serve [ARTIFACT]`: parse options into a ServeConfig and run the launcher."""
from __future__ import annotations

import sys

import click

from ninfer_jax.engine.config import MAX_LANES, MIN_LANES
from ninfer_jax.engine.speculation import BACKENDS, DRAFT_RANGES, SpeculativeConfig
from ninfer_jax.serve.config import SamplingOverrides, ServeConfig


def _kv_capacity(value: str | None):
    if value is None or value == "auto":
        return value
    try:
        tokens = int(value)
    except ValueError:
        raise click.BadParameter("expected a token count or 'auto'") from None
    if tokens <= 0:
        raise click.BadParameter("must be positive")
    return tokens


def _api_key(value: str | None, path: str | None) -> str | None:
    if path is None:
        return value or None
    if value:
        raise click.UsageError("give the API key once: --api-key (or NINFER_API_KEY) or "
                               "--api-key-file, not both")
    with open(path, encoding="utf-8") as handle:
        key = handle.readline().strip()
    if not key:
        raise click.BadParameter(f"{path} holds no key on its first line",
                                 param_hint="--api-key-file")
    return key


@click.command()
@click.argument("artifact", required=False)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--api-key", default=None, envvar="NINFER_API_KEY", show_envvar=True,
              help="Require this bearer token / x-api-key. Prefer NINFER_API_KEY or "
                   "--api-key-file: a command-line value is visible in `ps`.")
@click.option("--api-key-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Read the API key from this file (its first line).")
@click.option("--allowed-hosts", default="", show_default=False,
              help="Comma-separated Host header names answered besides IP addresses, "
                   "localhost, --host and this machine's names; '*' answers any host.")
@click.option("--model-id", default=None, help="Public model alias (default: artifact name).")
@click.option("--cors", is_flag=True, help="Permissive browser CORS headers.")
@click.option("--max-context", default=8192, show_default=True, type=click.IntRange(min=16))
@click.option("--kv-capacity", default=None,
              help="Shared KV pool in tokens, or 'auto' (free device memory). Default: one "
                   "--max-context per lane, within the auto bound.")
@click.option("--max-concurrency", default=1, show_default=True,
              type=click.IntRange(MIN_LANES, MAX_LANES),
              help="Resident execution lanes (also the largest decode batch).")
@click.option("--max-pending-requests", default=16, show_default=True, type=click.IntRange(min=0))
@click.option("--pending-timeout-ms", default=30000, show_default=True, type=click.IntRange(min=1))
@click.option("--prefill-chunk", default=1024, show_default=True, type=click.IntRange(min=16))
@click.option("--decode-share", default=0.25, show_default=True, type=click.FloatRange(0, 16),
              help="0: a step that prefills a prompt chunk carries no decode rows (prompts "
                   "first); above 0 running streams decode in every step, chunks included.")
@click.option("--default-max-tokens", default=8192, show_default=True, type=click.IntRange(min=1))
@click.option("--max-request-mib", default=32, show_default=True, type=click.IntRange(min=1),
              help="Largest request body, refused with 413 before it is parsed.")
@click.option("--no-prefix-reuse", is_flag=True,
              help="No cross-request prefix reuse (pause snapshots and replay still work).")
@click.option("--host-context-mib", default=None, type=click.IntRange(min=0),
              help="Host memory budget for KV spilled from the device pool and for pause "
                   "snapshots [default: 8192]; 0 disables the host tier.")
@click.option("--no-verify-checksums", "verify_checksums", is_flag=True, flag_value=False,
              default=True, help="Skip checking the artifact's file checksums at load (they "
                                 "read every weight byte once: about 1 s per GB).")
@click.option("--device-state-slots", default=None, type=click.IntRange(min=0),
              help="Hybrid models: device state slots beyond one per lane (total capacity "
                   "--max-concurrency + N; default N = --max-concurrency). Dense models have "
                   "no state slots: accepted, no effect.")
@click.option("--spec", default=None, type=click.Choice(BACKENDS),
              help="Speculative decoding backend (off by default). ngram: prompt lookup, "
                   "no weights; mtp, dflash, dflash2: not implemented yet. Refused for "
                   "hybrid models.")
@click.option("--draft-tokens", default=None, type=click.IntRange(min=1),
              help="Draft tokens per speculative round: "
                   + "; ".join(f"{b} {lo}..{hi} (default {d})"
                               for b, (lo, hi, d) in DRAFT_RANGES.items()) + ".")
@click.option("--kv-dtype", default="auto", show_default=True,
              help="KV page storage (auto: the compute dtype, f32 on CPU, bf16 on GPU; fp8 "
                   "(e4m3) and int8: 8-bit codes with a scale per token and KV head, about "
                   "half of bf16's bytes).",
              type=click.Choice(["auto", "f32", "bf16", "fp8", "int8"]))
@click.option("--chat-template", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option("--default-thinking-budget", default=None, type=click.IntRange(min=1))
@click.option("--no-thinking", is_flag=True)
@click.option("--preserve-thinking", is_flag=True)
@click.option("--vision", is_flag=True,
              help="Accept media input (needs an artifact with a vision component).")
@click.option("--response-store-max-records", default=1024, show_default=True,
              type=click.IntRange(min=0))
@click.option("--response-store-max-mib", default=256, show_default=True,
              type=click.IntRange(min=0))
@click.option("--request-log-jsonl", default=None, type=click.Path(dir_okay=False))
@click.option("--capture-requests", default=None, type=click.Path(dir_okay=False))
@click.option("--log-stats-interval-ms", default=5000, show_default=True,
              type=click.IntRange(min=0))
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["trace", "debug", "info", "warning", "error", "critical", "off"]))
@click.option("--temperature", default=None, type=click.FloatRange(0, 2))
@click.option("--top-p", default=None, type=click.FloatRange(0, 1))
@click.option("--top-k", default=None, type=click.IntRange(0, 20))
@click.option("--min-p", default=None, type=click.FloatRange(0, 1))
@click.option("--presence-penalty", default=None, type=click.FloatRange(-2, 2))
@click.option("--frequency-penalty", default=None, type=click.FloatRange(-2, 2))
@click.option("--seed", default=None, type=int)
@click.option("--greedy", is_flag=True)
@click.option("--device", default=0, show_default=True, type=click.IntRange(min=0),
              help="CUDA device index (among CUDA_VISIBLE_DEVICES when set) the engine core "
                   "uses. On CPU: accepted, no effect beyond the core's environment.")
@click.option("--no-cuda-graph", is_flag=True,
              help="Disable CUDA Graph decode graphs (XLA command buffers) in the engine core. "
                   "On CPU: accepted, no effect beyond the core's environment.")
@click.option("--step-shapes", default="all", show_default=True,
              type=click.Choice(["all", "essential"]),
              help="Step shapes compiled before the server is ready. 'essential': only the "
                   "few that can serve any step by padding (the smallest and largest decode "
                   "steps, the largest chunk step): a start several times faster, each step "
                   "padded to one of them.")
@click.option("--header-timeout", "header_timeout_s", default=10.0, show_default=True,
              type=click.FloatRange(min=0.1),
              help="Seconds a client has to send a request head (408 after).")
@click.option("--read-timeout", "read_timeout_s", default=30.0, show_default=True,
              type=click.FloatRange(min=0.1),
              help="Seconds one read of a request body, or one write of a reply, may stall.")
@click.option("--max-connections", default=1000, show_default=True,
              type=click.IntRange(min=1),
              help="Open connections per HTTP worker, idle ones included (independent of "
                   "--http-threads); past it new clients wait in the listen backlog.")
@click.option("--shutdown-timeout", "shutdown_timeout_s", default=30.0, show_default=True,
              type=click.FloatRange(min=0),
              help="On SIGTERM/SIGINT: seconds in-flight requests may take to finish before "
                   "they are ended with an error.")
@click.option("--http-threads", default=None, type=click.IntRange(min=2),
              help="HTTP threads per worker (one per open stream). Default: enough for every "
                   "lane and pending request, at least 32.")
@click.option("--http-workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="HTTP worker processes sharing the one engine core. Above 1 it needs the "
                   "Responses store off (--response-store-max-records 0) and no "
                   "--request-log-jsonl / --capture-requests: those are per worker.")
def serve(artifact, kv_capacity, spec, draft_tokens, temperature, top_p, top_k, min_p,
          presence_penalty, frequency_penalty, seed, greedy, api_key, api_key_file,
          allowed_hosts, **options):
    """Serve ARTIFACT (default: the embedded SmolLM2-135M-Instruct) over HTTP."""
    from ninfer_jax.artifact.default_model import default_artifact_path
    from ninfer_jax.serve.launcher import run_server

    try:
        speculative = SpeculativeConfig.from_options(spec, draft_tokens)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    kv_tokens = _kv_capacity(kv_capacity)
    if isinstance(kv_tokens, int) and kv_tokens < options["max_context"]:
        raise click.BadParameter(
            f"{kv_tokens} tokens is less than --max-context {options['max_context']}: one "
            "request at the full context could never fit; raise it, use 'auto', or lower "
            "--max-context", param_hint="--kv-capacity")
    config = ServeConfig(
        artifact=str(artifact or default_artifact_path()),
        kv_capacity=kv_tokens,
        api_key=_api_key(api_key, api_key_file),
        allowed_hosts=tuple(h.strip() for h in allowed_hosts.split(",") if h.strip()),
        spec=spec, draft_tokens=speculative.draft_tokens if speculative else None,
        sampling=SamplingOverrides(temperature, top_p, top_k, min_p, presence_penalty,
                                   frequency_penalty, seed, greedy),
        argv=tuple(sys.argv),
        **options,
    )
    run_server(config)
