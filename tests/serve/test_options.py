"""`ninfer serve`'s options come from the ServeConfig declarations; replay parses the same."""
from __future__ import annotations

import dataclasses

from click.testing import CliRunner

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.serve import launcher
from ninfer_jax.serve.config import SamplingOverrides, ServeConfig, option_of
from ninfer_jax.serve.options import click_options, parse_serve_args


def _served(monkeypatch, args):
    from ninfer_jax.cli.serve import serve

    seen = []
    monkeypatch.setattr(launcher, "run_server", seen.append)
    result = CliRunner().invoke(serve, ["a.ninfer", *args], env={"NINFER_API_KEY": ""})
    assert result.exit_code == 0, result.output
    return seen[0]


def test_every_declared_field_is_an_option_with_its_default():
    by_name = {o.name: o for o in click_options()}
    for cls in (ServeConfig, SamplingOverrides):
        for field in dataclasses.fields(cls):
            if option_of(field) is None:
                continue
            default = field.default
            expected = ",".join(default) if isinstance(default, tuple) else default
            assert by_name[field.name].default == expected, field.name
    assert {"api_key_file", "step_shapes", "top_k", "verify_checksums"} <= set(by_name)


def test_no_flags_give_the_dataclass_defaults(monkeypatch):
    config = _served(monkeypatch, [])
    assert dataclasses.replace(config, argv=()) == ServeConfig(artifact="a.ninfer")


def test_engine_defaults_are_the_engine_configs_own():
    built = EngineConfig.from_serve_config(ServeConfig(artifact="x"))
    # the one serve-level default: unset --device-state-slots means one spare per lane
    assert built.device_state_slots == 1
    assert dataclasses.replace(built, device_state_slots=0) == EngineConfig()


def test_replay_parses_serve_args_as_serve_does(monkeypatch):
    args = ["--max-concurrency", "3", "--kv-capacity", "auto", "--step-shapes", "essential",
            "--no-verify-checksums", "--top-k", "5", "--greedy", "--allowed-hosts",
            "a.example, b.example", "--spec", "ngram", "--header-timeout", "2.5"]
    served = _served(monkeypatch, args)
    replayed = parse_serve_args("a.ninfer", args)
    assert dataclasses.replace(served, argv=()) == dataclasses.replace(replayed, argv=())
    assert replayed.step_shapes == "essential" and replayed.verify_checksums is False
    assert replayed.sampling.top_k == 5 and replayed.sampling.greedy
    assert replayed.allowed_hosts == ("a.example", "b.example")
    assert replayed.draft_tokens is not None and replayed.header_timeout_s == 2.5


def test_bounds_and_choices_come_from_the_declarations():
    runner = CliRunner()
    from ninfer_jax.cli.serve import serve

    for args in (["--step-shapes", "some"], ["--max-concurrency", "0"], ["--top-k", "21"],
                 ["--kv-capacity", "10", "--max-context", "64"]):
        result = runner.invoke(serve, ["a.ninfer", *args])
        assert result.exit_code == 2, (args, result.output)


def test_top_k_flag_takes_zero_or_below_as_disabled_and_refuses_past_the_cap():
    from ninfer_jax.cli.serve import serve

    # Reaches the engine as is: SamplingParams reads any top_k <= 0 as no top-k filter.
    for value in (-1, -7):
        assert parse_serve_args("a.ninfer", ["--top-k", str(value)]).sampling.top_k == value
    result = CliRunner().invoke(serve, ["a.ninfer", "--top-k", "21"],
                                env={"NINFER_API_KEY": ""})
    assert result.exit_code != 0 and "--top-k" in result.output
