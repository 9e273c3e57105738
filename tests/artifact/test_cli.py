"""The artifact commands through Click's CliRunner: inspect-artifact, count-tokens,
init-random, convert errors."""
from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from ninfer_jax.cli.main import main

CAPITAL = "What is the capital of France? Answer in one sentence."


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input,
                              catch_exceptions=False)


def test_inspect_table_and_json(tiny_artifact_dir):
    table = run("inspect-artifact", tiny_artifact_dir)
    assert table.exit_code == 0, table.output
    assert "tiny-llama" in table.output and "layers.1.w_down" in table.output
    assert "[32, 16]" in table.output  # w_down is [F, H]
    report = json.loads(run("inspect-artifact", tiny_artifact_dir, "--json").output)
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["embed"] == {"name": "embed", "shape": [264, 16], "dtype": "float32",
                             "format": "f32", "bytes": 264 * 16 * 4}
    assert report["totals"]["bytes"] == sum(r["bytes"] for r in report["tensors"])
    assert report["totals"]["tensors"] == len(rows) == 2 + 1 + 2 * 9
    assert report["metadata"]["components"]["text"] is True


def test_inspect_reports_quantized_formats(tmp_path):
    out = tmp_path / "q.ninfer"
    assert run("init-random", "--preset", "qwen3-tiny", out, "--weights", "int8",
               "--quiet").exit_code == 0
    report = json.loads(run("inspect-artifact", out, "--json").output)
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["layers.0.wq.int8"]["format"] == "int8"
    assert rows["layers.0.wq.scale"]["format"] == "int8"
    assert rows["embed"]["format"] == "f32"
    assert run("init-random", "--preset", "qwen3-tiny", out, "--quiet").exit_code != 0


def test_inspect_of_a_broken_artifact_names_the_file(tmp_path):
    result = CliRunner().invoke(main, ["inspect-artifact", str(tmp_path)])
    assert result.exit_code != 0
    assert f"{tmp_path}/metadata.json: missing" in result.output


def test_count_tokens_matches_the_golden_prompt(default_artifact_path):
    result = run("count-tokens", default_artifact_path, "--text", CAPITAL, "--json")
    data = json.loads(result.output)
    assert data["count"] == 42 == len(data["ids"])
    assert data["ids"][-3:] == [1, 520, 9531, 198][-3:]
    assert run("count-tokens", "--text", CAPITAL).output.strip() == "42"  # default artifact
    raw = run("count-tokens", default_artifact_path, "--text", "Hello world", "--no-template")
    assert raw.output.strip() == "2"


def test_count_tokens_messages_with_tools(qwen3_tiny_dir, tmp_path):
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.text.chat_template import ChatRenderer
    from ninfer_jax.text.conversation import Conversation, Message, ToolSpec

    tool = {"type": "function", "function": {"name": "lookup", "description": "Find",
                                             "parameters": {"type": "object"}}}
    body = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}],
            "tools": [tool]}
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(body))
    counted = json.loads(run("count-tokens", qwen3_tiny_dir, "--messages", path, "--json").output)
    artifact = load_artifact(qwen3_tiny_dir, weights=False)
    expected = ChatRenderer(artifact.chat_template, artifact.load_tokenizer(),
                            artifact.chat_format).render(Conversation(
                                [Message("system", "S"), Message("user", "ab")],
                                [ToolSpec("lookup", "Find", {"type": "object"})]))
    assert counted["ids"] == expected.ids
    from_stdin = run("count-tokens", qwen3_tiny_dir, "--messages", "-",
                     input=json.dumps(body["messages"]))
    assert int(from_stdin.output) < counted["count"]  # no tools section


def test_count_tokens_usage_errors(default_artifact_path, tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["count-tokens", str(default_artifact_path)]).exit_code == 2
    both = runner.invoke(main, ["count-tokens", "--text", "a", "--messages", "-"], input="[]")
    assert both.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    result = runner.invoke(main, ["count-tokens", "--messages", str(bad)])
    assert result.exit_code == 1 and "not valid JSON" in result.output
    wrong_role = runner.invoke(main, ["count-tokens", "--messages", "-"],
                               input=json.dumps([{"role": "wizard", "content": "x"}]))
    assert wrong_role.exit_code == 1 and "messages[0].role" in wrong_role.output


def test_count_tokens_does_not_import_jax(default_artifact_path):
    code = ("import sys; from click.testing import CliRunner; from ninfer_jax.cli.main import main; "
            f"r = CliRunner().invoke(main, ['count-tokens', {str(default_artifact_path)!r}, "
            "'--text', 'hi']); print(r.output.strip(), 'jax' in sys.modules)")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert output == ["31", "False"]  # default system prompt + "hi"


def test_convert_refuses_existing_output(tiny_artifact_dir, tmp_path):
    from ninfer_jax.artifact.default_model import gguf_path

    result = CliRunner().invoke(main, ["convert", str(gguf_path()), str(tiny_artifact_dir)])
    assert result.exit_code == 1 and "already exists" in result.output


def test_unwritable_output_is_a_one_line_error(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    under_file = run("init-random", "--preset", "qwen3-tiny", a_file / "out", "--quiet")
    assert under_file.exit_code == 2
    assert f"cannot write {a_file / 'out'}: {a_file} is not a directory" in under_file.output
    # /proc exists but no directory can be made inside it: the write itself fails.
    in_proc = run("init-random", "--preset", "qwen3-tiny", "/proc/ninfer-nope/out", "--quiet")
    assert in_proc.exit_code == 1
    assert in_proc.output.startswith("Error: cannot write /proc/ninfer-nope/out: ")


def test_convert_of_an_artifact_needs_something_to_add(tiny_artifact_dir, tmp_path):
    plain = run("convert", tiny_artifact_dir, tmp_path / "copy")
    assert plain.exit_code == 1
    assert "nothing to convert" in plain.output and "not --weights" not in plain.output
    weights = run("convert", tiny_artifact_dir, tmp_path / "copy", "--weights", "int8")
    assert weights.exit_code == 1 and "not --weights" in weights.output


def test_draft_head_of_a_quantized_artifact_is_refused(default_artifact_path, tmp_path):
    # The default artifact keeps the GGUF's blocks, its tied embedding included.
    result = run("convert", default_artifact_path, tmp_path / "out", "--lm-head-draft-vocab",
                 "100", "--quiet")
    assert result.exit_code == 1
    assert "needs a float lm_head (this one is quantized)" in result.output
    assert not (tmp_path / "out").exists()


def test_count_tokens_of_media_needs_a_vision_artifact(default_artifact_path, tmp_path):
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(png, "PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    path = tmp_path / "media.json"
    path.write_text(json.dumps([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]))
    result = run("count-tokens", default_artifact_path, "--messages", path)
    assert result.exit_code == 1
    assert "messages[0].content[0]" in result.output
    assert "has no vision component" in result.output and "template failed" not in result.output
