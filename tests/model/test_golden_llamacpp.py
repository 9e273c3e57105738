"""The default model (SmolLM2-135M-Instruct, converted from its GGUF) against llama.cpp's
recorded outputs: teacher-forced top-1 agreement and the free-running greedy answer, for both
conversions of it: f32 (the GGUF's blocks expanded) and gguf (the blocks kept, CPU block kernel).

llama.cpp quantizes activations for its quantized matmuls, so its logits carry ~0.17 of
chaotic noise around an exact f32 forward. transformers (f32, same GGUF weights) agrees with
the golden top-1 on 354 of the 366 steps (96.7%) and so does our f32 artifact (its logits are
within 5e-5 of it); the golden's own llama.cpp version rebuilt here scores 348-351
(docs/numerics.md). Every miss is a llama.cpp near-tie where we pick its second choice. The
test pins exactly that: all our top-1s inside llama.cpp's top-5, misses only on ties, and at
least 96.5% equal to its top-1 for the exact forward. The block artifact rounds activations
as llama.cpp does and so carries noise of the same size; it must agree at least as often as
llama.cpp itself (348 of 366; 351 measured).
"""
from __future__ import annotations

import pytest

from ninfer_jax.artifact import load_artifact
from ninfer_jax.artifact.convert import convert
from ninfer_jax.artifact.default_model import (
    DEFAULT_MODEL_NAME,
    ensure_default_artifact,
    gguf_path,
)
from ninfer_jax.engine.runner import JaxRunner, kv_dtype_for
from ninfer_jax.kernels.quant_matmul.formats import BLOCK_FORMATS
from runner_driver import generate, teacher_forced

# Minimum agreed steps of 366, per conversion (--weights of `ninfer convert`), and the most
# llama.cpp's own first choice may lead ours by, in logits, where we differ. The f32 forward is
# exact, so its misses are near-ties. The block artifact rounds activations to 8 bits per block
# as llama.cpp does, whose noise (~0.15-0.2 logits) is chaotic: ulp-level changes upstream
# (a norm's summation order, the attention kernel) moved it over 345-355 agreed steps and its
# widest miss over 0.34-0.54 (docs/numerics.md); llama.cpp's own builds span 348-366 on this
# file. Its bounds sit under that spread; the kernel's arithmetic is checked exactly in
# tests/kernels/test_ggml_matmul.py.
MIN_TOP1_AGREED = {"f32": 354,  # 96.5% of 366, rounded up
                   "gguf": 343}
NEAR_TIE = {"f32": 0.5, "gguf": 0.75}


@pytest.fixture(scope="module", params=sorted(MIN_TOP1_AGREED))
def weights(request):
    return request.param


@pytest.fixture(scope="module")
def artifact(weights, tmp_path_factory):
    default = load_artifact(ensure_default_artifact(), weights=False)
    if is_conversion(default, weights):
        return load_artifact(default.path)
    # The other conversion (or a default artifact converted before DEFAULT_WEIGHTS changed):
    # about 7 s on a 2-core machine, so not cached.
    out = tmp_path_factory.mktemp("golden") / f"{DEFAULT_MODEL_NAME}-{weights}.ninfer"
    return load_artifact(convert(gguf_path(), out, name=DEFAULT_MODEL_NAME, weights=weights))


def is_conversion(artifact, weights: str) -> bool:
    """Whether `artifact` is the default GGUF converted with --weights `weights`."""
    layers = artifact.weight_formats["layers"]
    return layers in BLOCK_FORMATS if weights == "gguf" else layers == weights


@pytest.fixture(scope="module")
def runner(artifact, golden):
    cases = golden["cases"]
    # the KV pages `ninfer serve` gives this artifact (f16 for the block artifact on a CPU)
    return JaxRunner(artifact, num_pages=160, max_batch=len(cases), max_context=256,
                     prefill_chunk=128, kv_dtype=kv_dtype_for(
                         "auto", block_weights=artifact.weight_formats["layers"] in BLOCK_FORMATS))


def test_teacher_forced_top1_agrees_with_llamacpp(golden, runner, weights):
    cases = golden["cases"]
    predictions = teacher_forced(runner, [c["prompt_ids"] for c in cases],
                                 [c["greedy_ids"] for c in cases])
    steps = agreed = 0
    for case, predicted in zip(cases, predictions):
        assert len(predicted) == len(case["teacher_forced_top5"]), case["name"]
        for step, (ours, top5) in enumerate(zip(predicted, case["teacher_forced_top5"])):
            theirs = dict(top5)
            assert ours in theirs, f"{case['name']} step {step}: {ours} not in {top5}"
            assert top5[0][1] - theirs[ours] < NEAR_TIE[weights], f"{case['name']} step {step}"
            agreed += ours == top5[0][0]
            steps += 1
    assert steps == 366
    assert agreed >= MIN_TOP1_AGREED[weights], f"{agreed}/{steps} steps agree"


def test_greedy_answer_of_the_capital_case(golden, runner, artifact):
    # All cases in one batch (the bucket the teacher-forced test compiled); check `capital`.
    cases = golden["cases"]
    index = next(i for i, c in enumerate(cases) if c["name"] == "capital")
    case = cases[index]
    output = generate(runner, [c["prompt_ids"] for c in cases], len(case["greedy_ids"]) + 1)[index]
    eos = set(artifact.eos_ids)
    answer = output[:next(i for i, t in enumerate(output) if t in eos)]
    assert artifact.load_tokenizer().decode(answer) == case["greedy_text"]
