"""Every `ninfer init-random` preset, built at tiny dimensions through the CLI, loads and
answers: its template renders with the preset's own control tokens, its end tokens lie in the
vocabulary, and (dense presets) the real JaxRunner + Engine generate tokens that stop where
they should. Hybrid presets are served by the hybrid runner, which lives in its own branch
until merged; here they are checked up to their loaded weights, MTP head included."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from ninfer_jax.artifact.format import load_artifact
from ninfer_jax.artifact.presets import TINY_NEMOTRON
from ninfer_jax.artifact.random_init import PRESETS, TINY_DIMS
from ninfer_jax.cli.main import main
from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.request import Finished, GenerationRequest, SamplingParams, Tokens
from ninfer_jax.engine.runner import JaxRunner
from ninfer_jax.text.chat_template import ChatRenderer
from ninfer_jax.text.conversation import Conversation, Message, ToolSpec

MAX_CONTEXT, PAGE_SIZE, CHUNK = 128, 16, 64  # few compiled shapes per preset
NUM_NEW = 4
LOOKUP = ToolSpec("lookup", "Find a fact", {"type": "object", "properties": {}})
# What each preset must keep at any size: (end of a reply = first eos, beginning of text or
# None, how often a system + user prompt holds that end token). ChatML and Llama-3 close each
# turn with it (system and user: 2); GLM never closes a turn, a reply ends at the next role
# token, so the prompt holds <|user|> once, opening the user turn. Gemma closes each turn with
# <turn|> (system and user: 2) after <bos>. Nemotron ends only assistant turns with
# <SPECIAL_12>, so a system + user prompt holds none.
_CHATML_TURNS = ("<|im_end|>", None, 2)
_GLM_TURNS = ("<|user|>", None, 1)
TURN_TOKENS = {"qwen3-tiny": _CHATML_TURNS, "qwen3-vl-tiny": _CHATML_TURNS,
               "qwen3.5-dense-tiny": _CHATML_TURNS,
               "qwen3.5-tiny": _CHATML_TURNS, "qwen3.6-tiny-moe": _CHATML_TURNS,
               "qwen3-8b": _CHATML_TURNS, "qwen3.5-27b": _CHATML_TURNS,
               "qwen3.6-35b-a3b": _CHATML_TURNS, "glm4.5-tiny": _GLM_TURNS,
               "glm4.5-air": _GLM_TURNS, "gemma4-tiny": ("<turn|>", "<bos>", 2),
               "gemma4-31b": ("<turn|>", "<bos>", 2),
               "nemotron-h-tiny": ("<SPECIAL_12>", None, 0),
               "nemotron-h-8b": ("<SPECIAL_12>", None, 0),
               "nemotron-3-nano-tiny": ("<SPECIAL_12>", None, 0),
               "nemotron-3-nano-30b-a3b": ("<SPECIAL_12>", None, 0),
               "llama3-8b": ("<|eot_id|>", "<|begin_of_text|>", 2)}
# GLM MoE fields --tiny keeps.
GLM_KEPT = ("partial_rotary_factor", "attention_bias", "mlp_only_layers", "num_expert_groups",
            "num_topk_groups", "routed_scaling_factor", "norm_topk_prob")
# Gemma fields --tiny keeps.
GEMMA_KEPT = ("global_rope_theta", "partial_rotary_factor", "attention_k_eq_v",
              "final_logit_softcapping")
# Hybrid fields --tiny keeps (the widths and head counts shrink; their ratios stay).
HYBRID_KEPT = ("layer_types", "partial_rotary_factor", "attn_output_gate",
               "linear_conv_kernel_dim", "norm_topk_prob", "mtp_num_layers")


def cli_presets() -> list[str]:
    command = main.get_command(click.Context(main), "init-random")
    option = next(p for p in command.params if p.name == "preset")
    return list(option.type.choices)


def test_the_cli_offers_every_preset_and_each_is_covered_here():
    assert cli_presets() == list(PRESETS) == list(TURN_TOKENS)


@pytest.fixture(scope="module", params=list(PRESETS))
def tiny(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("preset") / f"{request.param}.ninfer"
    result = CliRunner().invoke(main, ["init-random", "--preset", request.param, "--tiny",
                                       str(out), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return request.param, load_artifact(out, mtp=PRESETS[request.param].config.mtp_num_layers > 0)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    """The preset's tokenizer, built once per preset (a full-size vocabulary: about a second)."""
    _, artifact = tiny
    return artifact.load_tokenizer()


def test_tiny_keeps_everything_but_the_dimensions(tiny):
    name, artifact = tiny
    full, config = PRESETS[name].config, artifact.config
    for field, value in TINY_DIMS.items():
        if field == "num_layers" and full.is_nemotron:  # one block of each of three kinds
            value = len(TINY_NEMOTRON["layer_types"])
        assert getattr(config, field) == value, field
    kept = ("architecture", "vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling",
            "tie_word_embeddings", "qk_norm", "max_position_embeddings")
    assert {f: getattr(config, f) for f in kept} == {f: getattr(full, f) for f in kept}
    group = full.num_heads // full.num_kv_heads
    assert config.num_heads // config.num_kv_heads == min(group, config.num_heads)
    assert artifact.chat_format["tool_call_format"] == PRESETS[name].tool_call_format
    assert artifact.name == name if config == full else artifact.name == f"{name}-tiny"
    if full.is_hybrid:
        kept = {f: getattr(config, f) for f in HYBRID_KEPT if f != "layer_types"}
        assert kept == {f: getattr(full, f) for f in HYBRID_KEPT if f != "layer_types"}
        assert set(config.layer_types) == {"linear_attention", "full_attention"}
        assert (config.linear_num_value_heads // config.linear_num_key_heads
                == full.linear_num_value_heads // full.linear_num_key_heads)
        assert bool(config.num_experts) == bool(full.num_experts)
        assert bool(config.shared_expert_intermediate_size) == bool(
            full.shared_expert_intermediate_size)
    if full.is_glm:
        assert {f: getattr(config, f) for f in GLM_KEPT} == {f: getattr(full, f) for f in GLM_KEPT}
        assert config.num_experts and config.shared_expert_intermediate_size
        assert 0 < len(config.mlp_only_layers) < config.num_layers  # dense first, then MoE
    if full.is_gemma:
        assert {f: getattr(config, f) for f in GEMMA_KEPT} == {
            f: getattr(full, f) for f in GEMMA_KEPT}
        assert config.layer_types == ("sliding_attention", "full_attention")
        assert config.global_head_dim == 32 and config.sliding_window <= full.sliding_window
    if full.is_nemotron:
        assert config.layer_types == ("mamba", "attention", "moe" if full.num_experts else "mlp")
        kept = ("num_expert_groups", "num_topk_groups", "routed_scaling_factor",
                "norm_topk_prob")
        assert {f: getattr(config, f) for f in kept} == {f: getattr(full, f) for f in kept}
        assert config.mamba_conv_kernel == full.mamba_conv_kernel


def test_hybrid_presets_carry_their_mtp_head(tiny):
    name, artifact = tiny
    config = artifact.config
    assert artifact.components["mtp"] == config.is_hybrid
    if not config.is_hybrid:
        return
    head = artifact.params["mtp"]
    assert head["fc"].shape == (2 * config.hidden_size, config.hidden_size)
    (layer,) = head["layers"]
    full = artifact.params["layers"][config.layer_types.index("full_attention")]
    assert {k: v.shape for k, v in layer.items()} == {k: v.shape for k, v in full.items()}


def test_end_tokens_and_template_agree_with_the_vocabulary(tiny, tokenizer):
    name, artifact = tiny
    end_of_turn, begin, ends_per_prompt = TURN_TOKENS[name]
    assert all(0 <= i < min(tokenizer.vocab_size, artifact.config.vocab_size)
               for i in artifact.eos_ids)
    assert artifact.eos_ids[0] == tokenizer.token_to_id(end_of_turn)
    assert all(tokenizer.is_control(i) for i in artifact.eos_ids)
    rendered = _render(artifact, tokenizer, tools=[LOOKUP])
    assert rendered.ids.count(artifact.eos_ids[0]) == ends_per_prompt
    assert '"name": "lookup"' in rendered.text and "Say hi." in rendered.text
    bos = artifact.metadata["special_tokens"]["bos_id"]
    assert bos == (tokenizer.token_to_id(begin) if begin else None)
    assert (rendered.ids[0] == bos) if begin else (bos not in rendered.ids)


def _render(artifact, tokenizer, tools=()):
    renderer = ChatRenderer(artifact.chat_template, tokenizer, artifact.chat_format)
    messages = [Message("system", "Be brief."), Message("user", "Say hi.")]
    return renderer.render(Conversation(messages, list(tools)))


@pytest.fixture(scope="module")
def engine(tiny):
    _, artifact = tiny
    config = EngineConfig(max_concurrency=1, max_context=MAX_CONTEXT, prefill_chunk=CHUNK)
    runner = JaxRunner(artifact, num_pages=config.num_pages(PAGE_SIZE), page_size=PAGE_SIZE,
                       max_batch=1, max_context=MAX_CONTEXT, prefill_chunk=CHUNK,
                       state_slot_capacity=config.state_slot_capacity(
                           artifact.config.has_state),
                       step_shapes="essential")
    engine = Engine(runner, config, eos_ids=artifact.eos_ids)
    engine.start()
    assert engine.wait_ready(300)
    yield engine
    engine.shutdown(timeout=10)


def _generate(engine, request_id, prompt, stop_ids) -> tuple[list[int], Finished]:
    request = GenerationRequest(request_id, list(prompt), SamplingParams(temperature=0.0),
                                NUM_NEW, stop_token_ids=frozenset(stop_ids))
    streamed, finished = [], None
    for event in engine.submit(request).events():
        if isinstance(event, Tokens):
            streamed.extend(event.ids)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None, "the request failed"
    assert list(finished.output_ids) == streamed
    return streamed, finished


def test_the_preset_answers_through_the_real_runner(tiny, tokenizer, engine):
    _, artifact = tiny
    prompt = _render(artifact, tokenizer).ids
    output, finished = _generate(engine, "length", prompt, artifact.eos_ids)
    assert finished.reason == "length" and len(output) == NUM_NEW
    assert all(0 <= t < artifact.config.vocab_size for t in output)
    assert isinstance(tokenizer.decode(output), str)
    assert finished.usage.prompt_tokens == len(prompt)
    # A stop token ends the reply where it is generated (greedy: the same tokens again).
    stop = output[1]
    stopped, finished = _generate(engine, "stop", prompt, {*artifact.eos_ids, stop})
    assert finished.reason == "stop" and finished.matched_stop_token == stop
    assert stopped == output[:output.index(stop) + 1]
