"""What is only known to be bad once read (a --chat-template file, the artifact's tokenizer
or template): refused by the launcher in one `cannot serve` line naming the option or the
file, exit status 2, before the engine core starts or any weight is read."""
import socket
import subprocess
import sys

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(artifact, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ninfer_jax.cli.main", "serve", str(artifact),
         "--port", str(_free_port()), *map(str, args)],
        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("content, says", [
    (b"{% if %}", "chat template line 1: Expected an expression"),
    (b"\xff\xfe{{ x }}", "'utf-8' codec can't decode byte 0xff"),
])
def test_a_bad_chat_template_is_one_line_naming_the_option(default_artifact_path, tmp_path,
                                                          content, says):
    template = tmp_path / "t.jinja"
    template.write_bytes(content)
    result = _serve(default_artifact_path, "--chat-template", template)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert f"cannot serve: --chat-template {template}: {says}" in errors[0]
    assert "engine core" not in result.stderr  # refused before the core was started


def _artifact_with(default_artifact_path, tmp_path, name: str, content: str):
    """A copy of the default artifact (weights linked, not copied) with one file replaced."""
    copy = tmp_path / "copy.ninfer"
    copy.mkdir()
    for entry in default_artifact_path.iterdir():
        (copy / entry.name).symlink_to(entry.resolve())
    (copy / name).unlink()
    (copy / name).write_text(content)
    return copy


@pytest.mark.parametrize("name, content, says", [
    ("tokenizer.json", '{"garbage": 1', "tokenizer.json: not a valid tokenizer"),
    ("chat_template.jinja", "{% for %}", "chat_template.jinja: chat template line 1"),
])
def test_a_damaged_tokenizer_or_template_is_one_line(default_artifact_path, tmp_path, name,
                                                     content, says):
    copy = _artifact_with(default_artifact_path, tmp_path, name, content)
    result = _serve(copy)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"cannot serve: {copy}/{says}" in errors[0], result.stderr
    assert "engine core" not in result.stderr


@pytest.mark.parametrize("args, says", [
    (["--expert-parallel"], "--expert-parallel needs --tensor-parallel 2 or more"),
    (["--tensor-parallel", "2"], "--tensor-parallel 2 does not divide the model's 9 attention"),
])
def test_a_mesh_the_model_cannot_split_is_refused_before_the_core(default_artifact_path, args,
                                                                  says):
    result = _serve(default_artifact_path, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"cannot serve: {says}" in errors[0], result.stderr
    assert "engine core" not in result.stderr  # refused before the core was started
