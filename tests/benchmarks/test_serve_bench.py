"""benchmarks/serve_bench.py: its statistics by hand, and its measurements against a fake
server whose chunk timing is known."""
from __future__ import annotations

import json

import httpx
import pytest
from fake_sse import FakeCompletions

import serve_bench


def test_percentile_is_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert serve_bench.percentile(values, 0.5) == 3.0
    assert serve_bench.percentile(values, 0.99) == 5.0
    assert serve_bench.percentile(values, 0.2) == 1.0
    assert serve_bench.percentile([], 0.5) is None


def test_token_prompts_are_exact_repeatable_and_distinct():
    first = serve_bench.token_prompt(7, 256)
    assert len(first) == 256
    assert first == serve_bench.token_prompt(7, 256)
    assert first != serve_bench.token_prompt(8, 256)
    assert first != serve_bench.token_prompt(7, 256, seed=1)
    low, high = serve_bench.TOKEN_ID_RANGE
    assert all(low <= t < high for t in first)


def test_chat_prompt_is_padded_to_about_the_asked_length():
    assert serve_bench.chat_prompt(0) == serve_bench.PROMPTS[0]
    assert len(serve_bench.chat_prompt(3, 200).split()) == 201  # + "Context:"


def test_largest_gap_counts_gaps_overlapping_the_window_and_open_ends():
    streams = [[0.0, 1.0, 2.0, 5.0], [0.0, 0.5, 3.5]]
    # Window [2.5, 3.0]: stream 0's gap 2 -> 5 (3 s) overlaps, stream 1's 0.5 -> 3.5 (3 s).
    assert serve_bench.largest_gap(streams, 2.5, 3.0) == pytest.approx(3.0)
    # Window [0.2, 0.9]: 0 -> 1 (1 s) and 0 -> 0.5, 0.5 -> 3.5 (3 s) overlap.
    assert serve_bench.largest_gap(streams, 0.2, 0.9) == pytest.approx(3.0)
    # A stream with no chunk after the window's end is still waiting: 1.0 -> 4.0 counts.
    assert serve_bench.largest_gap([[0.0, 1.0]], 2.0, 4.0) == pytest.approx(3.0)
    assert serve_bench.largest_gap([[5.0, 6.0]], 0.0, 1.0) is None


def test_summarize_by_hand():
    results = [
        {"sent": 0.0, "chunks": [0.5, 0.6, 0.7, 0.8, 0.9], "tokens": 5, "prompt_tokens": 10,
         "timings": {"prompt_ms": 400.0, "predicted_per_second": 12.0}, "error": None},
        {"sent": 0.0, "chunks": [1.0, 1.2, 1.4], "tokens": 3, "prompt_tokens": 10,
         "timings": {"prompt_ms": 900.0, "predicted_per_second": 6.0}, "error": None},
        {"sent": 0.0, "chunks": [], "tokens": 0, "prompt_tokens": None, "timings": None,
         "error": "HTTP 503: busy"},
    ]
    level = serve_bench.summarize(results, wall=2.0, concurrency=2, max_tokens=5)
    assert level["output_tokens"] == 8 and level["output_tok_s"] == 4.0
    assert level["num_errors"] == 1 and level["errors"] == ["HTTP 503: busy"]
    assert level["num_short"] == 1  # the 3-token reply
    # Stream rates: 4 tokens over 0.4 s = 10/s, 2 over 0.4 s = 5/s; nearest-rank median 5.
    assert level["request_tok_s_p50"] == pytest.approx(5.0)
    assert level["request_tok_s_min"] == pytest.approx(5.0)
    assert level["decode_tok_s"] == pytest.approx(10.0)
    assert level["ttft_p50_s"] == 0.5 and level["ttft_p99_s"] == 1.0
    assert level["itl_max_s"] == pytest.approx(0.2)
    assert level["itl_p50_s"] == pytest.approx(0.1)
    assert level["tokens_per_chunk"] == 1.0
    assert level["server_prompt_ms_p50"] == 400.0
    assert level["server_decode_tok_s"] == pytest.approx(12.0)  # 2 x the median 6
    # A failed stream: no window in which every stream decodes.
    assert level["full_decode_tok_s"] is None


def test_the_full_window_counts_tokens_while_every_stream_decodes():
    """From the last first chunk (1.0) to the first last chunk (2.0): stream A delivers
    chunks at 1.5 and 2.0 (one token each), B at 1.5 (two tokens a chunk: 6 tokens in 3
    chunks): 4 tokens in 1 s. A stream that ends before another starts leaves no window."""
    results = [
        {"sent": 0.0, "chunks": [0.1, 0.5, 1.0, 1.5, 2.0], "tokens": 5, "prompt_tokens": 10,
         "timings": None, "error": None},
        {"sent": 0.0, "chunks": [1.0, 1.5, 3.0], "tokens": 6, "prompt_tokens": 10,
         "timings": None, "error": None},
    ]
    level = serve_bench.summarize(results, wall=3.0, concurrency=2, max_tokens=6)
    assert level["full_window_s"] == pytest.approx(1.0)
    assert level["full_decode_tok_s"] == pytest.approx(4.0)
    apart = [dict(results[0], chunks=[0.1, 0.2]), dict(results[1], chunks=[0.5, 0.6])]
    assert serve_bench.summarize(apart, wall=1.0, concurrency=2,
                                 max_tokens=6)["full_decode_tok_s"] is None


@pytest.fixture
def fake():
    server = FakeCompletions(interval=0.02, long_prompt=100, long_delay=0.3)
    yield server
    server.shutdown()


def _json_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_levels_against_a_server_of_known_timing(fake, capsys):
    rc = serve_bench.main(["--url", fake.url, "--api", "completions", "--prompt-tokens", "24",
                           "--max-tokens", "6", "--concurrency", "1", "3",
                           "--requests-per-client", "1", "--json"])
    assert rc == 0
    levels = _json_lines(capsys)
    assert [lv["concurrency"] for lv in levels] == [1, 3]
    for level in levels:
        assert level["num_errors"] == 0 and level["num_short"] == 0
        assert level["output_tokens"] == 6 * level["concurrency"]
        assert level["prompt_tokens"] == 24
        assert 0.018 <= level["itl_p50_s"] < 0.2  # the fake sends a chunk every 20 ms
        assert 5 <= level["request_tok_s_p50"] <= 55
        assert 5 * level["concurrency"] <= level["server_decode_tok_s"] <= 55 * level["concurrency"]
    # Warm-up + 1 + 3 requests, each prompt exact and distinct, every one with ignore_eos.
    prompts = [tuple(b["prompt"]) for b in fake.bodies]
    assert len(prompts) == 5 and len(set(prompts)) == 5
    assert all(len(p) == 24 for p in prompts)
    assert all(b["ignore_eos"] and b["stream"] and b["temperature"] == 0 for b in fake.bodies)


def test_chat_levels_use_the_padded_prompts(fake, capsys):
    rc = serve_bench.main(["--url", fake.url, "--prompt-tokens", "40", "--max-tokens", "3",
                           "--concurrency", "2", "--requests-per-client", "1", "--json"])
    assert rc == 0
    [level] = _json_lines(capsys)
    assert level["api"] == "chat" and level["output_tokens"] == 6 and level["num_errors"] == 0
    assert level["prompt_tokens"] == 41  # 40 words asked, + "Context:"


def test_echo_task_runs_each_level_plain_then_drafted(fake, capsys):
    rc = serve_bench.main(["--url", fake.url, "--task", "echo", "--draft", "both",
                           "--max-tokens", "3", "--concurrency", "1", "2",
                           "--requests-per-client", "1", "--json"])
    assert rc == 0
    levels = _json_lines(capsys)
    assert [(lv["concurrency"], lv["draft"]) for lv in levels] == [
        (1, "off"), (1, "on"), (2, "off"), (2, "on")]
    bodies = fake.bodies[1:]  # after the warm-up
    assert [b.get("draft", True) for b in bodies] == [False, True, False, False, True, True]
    assert all(b["messages"][0]["content"].startswith("Repeat this paragraph exactly: ")
               and b["ignore_eos"] is False for b in bodies)


def test_a_refused_request_is_reported_not_raised(fake):
    with httpx.Client(base_url=fake.url) as client:
        result = serve_bench.one_request(client, "/v1/completions",
                                         {"prompt": [1, 2], "max_tokens": 2, "stream": True})
    assert result["error"].startswith("HTTP 400") and result["chunks"] == []
    assert result["tokens"] == 0


def test_interference_measures_the_late_prompt_and_the_streams(fake, capsys):
    rc = serve_bench.main(["--url", fake.url, "--api", "completions", "--prompt-tokens", "16",
                           "--max-tokens", "200", "--interference", "3", "--long-prompt",
                           "150", "--warm-chunks", "3", "--steady-s", "0.2", "--json"])
    assert rc == 0
    [record] = _json_lines(capsys)
    assert record["streams_warm"] and record["streams_finished_early"] == 0
    assert record["stream_errors"] == 0 and record["long_error"] is None
    assert record["long_prompt_tokens"] == 150
    assert 0.3 <= record["long_ttft_s"] < 1.5  # the fake holds a long prompt 0.3 s
    assert 0.018 <= record["stream_gap_max_during_s"] < 0.5
    assert 0.018 <= record["stream_itl_p50_before_s"] < 0.2
    assert record["stream_gap_max_before_s"] >= record["stream_itl_p50_before_s"]


def test_completions_needs_a_prompt_length():
    with pytest.raises(SystemExit):
        serve_bench.parse_args(["--api", "completions"])
