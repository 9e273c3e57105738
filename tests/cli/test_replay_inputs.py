"""`ninfer replay` refuses bad input in one line with exit status 2 (1 is kept for failed or
mismatched requests), before any request is sent or any engine built: --serve-args that
`ninfer serve` would refuse, or that the in-process server would ignore, a --url that is not
one, --serve-args with --url, a non-positive --timeout, a directory that is not an artifact."""
import json

import pytest
from click.testing import CliRunner

from ninfer_jax.cli.replay import replay


@pytest.fixture
def capture(tmp_path):
    path = tmp_path / "capture.jsonl"
    path.write_text(json.dumps({"event": "request_capture", "request_id": "r1",
                                "endpoint": "/v1/completions",
                                "body": {"model": "m", "prompt": "hi"}}) + "\n")
    return path


def _replay(*args):
    return CliRunner().invoke(replay, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("serve_args, says", [
    ("--bogus", "--serve-args: No such option '--bogus'"),
    ("--kv-capacity 1", "--serve-args: Invalid value for --kv-capacity: 1 tokens is less"),
    ("'--seed", "Invalid value for --serve-args: No closing quotation"),
    ("--spec mtp", "--spec mtp needs a model with an MTP head"),
    ("--request-log-jsonl x.jsonl", "--request-log-jsonl does not apply to the replay's "
                                    "in-process server (use replay's --server-log)"),
    ("--port 9000", "--port does not apply"),
    ("--http-workers 2", "--http-workers does not apply"),
])
def test_serve_args_are_checked_before_the_engine_is_built(capture, default_artifact_path,
                                                           serve_args, says):
    result = _replay(capture, "--artifact", default_artifact_path, "--serve-args", serve_args)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "Usage: serve" not in result.output  # no usage line of a command the user never ran


def test_a_bad_chat_template_in_serve_args(capture, default_artifact_path, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% if %}")
    result = _replay(capture, "--artifact", default_artifact_path,
                     "--serve-args", f"--chat-template {template}")
    assert result.exit_code == 2
    assert f"--chat-template {template}: chat template line 1" in result.output


@pytest.mark.parametrize("args, says", [
    (["--url", "127.0.0.1:8080"], "'127.0.0.1:8080' is not an http:// or https:// URL"),
    (["--url", "http://127.0.0.1:1", "--serve-args", "--seed 1"],
     "--serve-args applies to --artifact only"),
    (["--url", "http://127.0.0.1:1", "--timeout", "0"], "0.0 is not in the range x>0"),
    (["--url", "http://127.0.0.1:1", "--server-log", "/nonexistent-dir/log.jsonl"],
     "Invalid value for --server-log: /nonexistent-dir/log.jsonl does not exist"),
])
def test_bad_target_options(capture, args, says):
    result = _replay(capture, *args)
    assert result.exit_code == 2 and says in result.output


def test_a_directory_that_is_not_an_artifact(capture, tmp_path):
    result = _replay(capture, "--artifact", tmp_path)
    assert result.exit_code == 2
    assert result.output == f"Error: {tmp_path}/metadata.json: missing\n"


def test_an_unusable_server_log_names_replays_option(capture, default_artifact_path):
    result = _replay(capture, "--artifact", default_artifact_path,
                     "--server-log", "/nonexistent-dir/log.jsonl")
    assert result.exit_code == 2
    assert "--server-log /nonexistent-dir/log.jsonl: the directory" in result.output
