"""`ninfer serve`'s options as a user meets them: every one explained in --help, and values
that would silently weaken the server refused at parse time (exit 2)."""
from click.testing import CliRunner

from ninfer_jax.cli.serve import serve


def test_every_option_has_help_text():
    unexplained = [p.opts[0] for p in serve.params
                   if p.param_type_name == "option" and not p.help]
    assert unexplained == []


def test_an_empty_api_key_is_refused_not_an_open_server():
    for key in ("", "  "):
        result = CliRunner().invoke(serve, ["a.ninfer", "--api-key", key])
        assert result.exit_code == 2
        assert "Invalid value for --api-key: is empty" in result.output


def test_an_empty_environment_key_means_no_key(monkeypatch):
    from ninfer_jax.serve.options import parse_serve_args

    monkeypatch.setenv("NINFER_API_KEY", "")
    assert parse_serve_args("a.ninfer", []).api_key is None
    monkeypatch.setenv("NINFER_API_KEY", "k")
    assert parse_serve_args("a.ninfer", []).api_key == "k"


def test_every_option_of_every_command_has_help_text():
    from ninfer_jax.cli.main import main

    unexplained = [f"{name} {p.opts[0]}" for name, command in main.commands.items()
                   for p in command.params if p.param_type_name == "option" and not p.help]
    assert unexplained == []
