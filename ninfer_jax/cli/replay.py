"""`ninfer replay FILE (--url URL | --artifact PATH) [--compare LOG.jsonl] [--concurrency N]
[--json]`: re-send captured requests, report latency and throughput, and compare generated
token ids with an earlier request log (the logic lives in ninfer_jax/replay/)."""
from __future__ import annotations

import json
import os
import shlex
import sys

import click


@click.command()
@click.argument("capture_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--url", default=None, help="A running server, e.g. http://127.0.0.1:8080.")
@click.option("--artifact", default=None, type=click.Path(exists=True, file_okay=False),
              help="Serve this artifact in-process instead of using --url.")
@click.option("--compare", "compare_log", default=None,
              type=click.Path(exists=True, dir_okay=False),
              help="A request log of an earlier run: compare generated_token_ids per request.")
@click.option("--server-log", default=None, type=click.Path(dir_okay=False),
              help="The replay server's request log: with --url, the log that server writes "
                   "(--request-log-jsonl); with --artifact, where to keep the replay's log.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Requests in flight at once (in capture order).")
@click.option("--api-key", envvar="NINFER_API_KEY", default=None,
              help="Bearer token for --url (or NINFER_API_KEY).")
@click.option("--serve-args", default="",
              help="ninfer serve options for --artifact, e.g. '--max-context 1024 --seed 7'.")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True,
              type=click.FloatRange(0, min_open=True), help="Seconds per request.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def replay(capture_file, url, artifact, compare_log, server_log, concurrency, api_key,
           serve_args, timeout_s, as_json):
    """Replay the requests captured in CAPTURE_FILE (ninfer serve --capture-requests).

    Exit status 1 when a request fails or, with --compare, when a deterministic (greedy or
    seeded) request generates different tokens than in the earlier log; 2 for bad input
    (options, files, --serve-args that `ninfer serve` would refuse)."""
    import logging.config

    from ninfer_jax.replay.records import ReplayInputError
    from ninfer_jax.serve.launcher import logging_config
    from ninfer_jax.replay.report import format_text, is_success
    from ninfer_jax.replay.run import ReplayOptions, run_replay

    if url is not None and not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} is not an http:// or https:// URL",
                                 param_hint="--url")
    if url is not None and server_log is not None and not os.path.isfile(server_log):
        raise click.BadParameter(f"{server_log} does not exist (with --url it is the running "
                                 "server's --request-log-jsonl, which it opened at start-up)",
                                 param_hint="--server-log")
    if serve_args and artifact is None:
        raise click.UsageError("--serve-args applies to --artifact only (a --url server "
                               "keeps the options it was started with)")
    try:
        serve_argv = tuple(shlex.split(serve_args))
    except ValueError as exc:  # an unclosed quote
        raise click.BadParameter(str(exc), param_hint="--serve-args") from None
    if not logging.getLogger().handlers:  # a host program (or pytest) keeps its own
        # The in-process server (--artifact) reports warnings and errors in the serve format.
        logging.config.dictConfig(logging_config("warning"))
    options = ReplayOptions(capture_file=capture_file, url=url, artifact=artifact,
                            compare_log=compare_log, server_log=server_log,
                            concurrency=concurrency, api_key=api_key,
                            serve_args=serve_argv, timeout_s=timeout_s)
    try:
        report = run_replay(options)
    except ReplayInputError as exc:
        failure = click.ClickException(str(exc))
        failure.exit_code = 2  # a bad input, not a failed or mismatched request (1)
        raise failure from None
    click.echo(json.dumps(report, indent=2) if as_json else format_text(report))
    sys.exit(0 if is_success(report) else 1)
