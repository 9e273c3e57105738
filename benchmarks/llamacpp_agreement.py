"""How well does llama.cpp itself agree with the golden file it is supposed to have produced?

    PYTHONPATH=<llama-cpp-python source> LLAMA_CPP_LIB_PATH=<its built libs> \
        .venv/bin/python benchmarks/llamacpp_agreement.py [--flash-attn] [--mode batch|seq]

Runs llama-cpp-python (the version named in tests/golden/smollm2_llamacpp.json, built here:
docs/numerics.md says how) on the default model's GGUF with the golden's settings (2 threads,
every position's logits kept), teacher-forces each case's prompt + greedy ids and scores the
result exactly as tests/model/test_golden_llamacpp.py scores us: top-1 agreement with the
recorded `teacher_forced_top5` and the mean |logit difference| over those top-5 entries.
`--mode batch` evaluates prompt + continuation in one call, `--mode seq` the prompt and then
one token per call (the two take different kernel paths inside llama.cpp). Not part of the
test suite: it needs a llama.cpp build, which CI does not have.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from ninfer_jax.artifact.default_model import gguf_path

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "tests" / "golden" / "smollm2_llamacpp.json"


def case_logits(llm, case, mode: str) -> np.ndarray:
    """Rows of logits predicting each continuation token (prompt end onwards)."""
    prompt, continuation = case["prompt_ids"], case["greedy_ids"]
    llm.reset()
    if mode == "batch":
        llm.eval(prompt + continuation)
    else:
        llm.eval(prompt)
        for token in continuation:
            llm.eval([token])
    # A copy: llm.scores is a view of a buffer that the next case overwrites.
    scores = np.array(llm.scores[:len(prompt) + len(continuation)])
    return scores[len(prompt) - 1:]


def score(cases, rows_per_case) -> dict:
    """As the golden test scores us, plus its near-tie measure: for each miss, how much lower
    the golden's logit of the pick is than the golden's top-1 (the test's NEAR_TIE bound), and
    how many picks fall outside the golden's top-5."""
    agreed = steps = outside_top5 = 0
    differences, miss_gaps = [], []
    for case, rows in zip(cases, rows_per_case):
        for row, top5 in zip(rows, case["teacher_forced_top5"]):
            pick = int(np.argmax(row))
            agreed += pick == top5[0][0]
            steps += 1
            differences += [abs(float(row[token]) - value) for token, value in top5]
            theirs = dict(top5)
            if pick != top5[0][0]:
                if pick in theirs:
                    miss_gaps.append(top5[0][1] - theirs[pick])
                else:
                    outside_top5 += 1
    return {"agreed": agreed, "steps": steps, "top1_agreement": agreed / steps,
            "mean_abs_logit_difference": float(np.mean(differences)),
            "widest_miss_gap": max(miss_gaps, default=0.0), "outside_top5": outside_top5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flash-attn", action="store_true")
    parser.add_argument("--mode", choices=("batch", "seq"), default="batch")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from llama_cpp import Llama  # only this script needs it

    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    llm = Llama(str(gguf_path()), n_ctx=512, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=True, flash_attn=args.flash_attn,
                verbose=False)
    rows = [case_logits(llm, case, args.mode) for case in golden["cases"]]
    result = score(golden["cases"], rows)
    print(json.dumps({"reference": golden["reference"], "flash_attn": args.flash_attn,
                      "mode": args.mode, **result}, indent=2))


if __name__ == "__main__":
    main()
