"""Admission bypass and the decode share between prefill chunks."""
from ninfer_jax.engine.request import Admitted

from engine_testkit import Driver, drain, expected_output, finished, make_request, prompt_of


def admitted_time(events):
    return next(e.time for e in events if isinstance(e, Admitted))


def busy_driver(**config):
    """A driver whose one resident request holds 6 of the 10 pages (page size 4)."""
    driver = Driver(num_pages=11, page_size=4, **config)
    driver.submit(make_request(prompt_of(20), max_tokens=3))
    driver.step()  # admitted: its whole prompt (6 pages) is promised to it
    return driver


def test_small_request_bypasses_a_head_that_does_not_fit():
    driver = busy_driver(max_concurrency=3)
    head = driver.submit(make_request(prompt_of(24, salt=1), max_tokens=2))  # needs 7 pages
    small = driver.submit(make_request(prompt_of(3, salt=2), max_tokens=2))  # needs 1 page
    driver.run()
    head_events, small_events = drain(head), drain(small)
    assert admitted_time(small_events) < admitted_time(head_events)
    assert list(finished_from(head_events)) == expected_output(prompt_of(24, salt=1), 2)
    assert list(finished_from(small_events)) == expected_output(prompt_of(3, salt=2), 2)


def test_bypass_is_bounded_per_head():
    driver = busy_driver(max_concurrency=4, max_bypass=1)
    head = driver.submit(make_request(prompt_of(24, salt=1), max_tokens=2))
    first = driver.submit(make_request(prompt_of(3, salt=2), max_tokens=2))
    second = driver.submit(make_request(prompt_of(3, salt=3), max_tokens=2))
    driver.run()
    head_t, first_t, second_t = (admitted_time(drain(h)) for h in (head, first, second))
    assert first_t < head_t < second_t  # one overtaking allowed, then FIFO again


def finished_from(events):
    return events[-1].output_ids


def round_kinds(driver):
    """P: a chunk alone, D: decode rows alone, M: a chunk and decode rows in one step."""
    return "".join("M" if s.chunk and s.rows else "P" if s.chunk else "D"
                   for s in driver.schedules)


def start_long_prompt_behind_a_stream(decode_share):
    driver = Driver(max_concurrency=2, prefill_chunk=4, decode_share=decode_share)
    stream = driver.submit(make_request(prompt_of(3), max_tokens=12))
    driver.step()  # the stream's prompt: it is decode-ready now
    driver.schedules.clear()
    driver.submit(make_request(prompt_of(20, salt=1), max_tokens=2))  # five chunks
    driver.run()
    return driver, stream


def test_decode_share_zero_prefills_whole_prompts_first():
    driver, stream = start_long_prompt_behind_a_stream(0.0)
    assert round_kinds(driver).startswith("PPPPP")
    assert list(finished(stream).output_ids) == expected_output(prompt_of(3), 12)


def test_streams_ride_along_with_every_prefill_chunk():
    driver, stream = start_long_prompt_behind_a_stream(0.25)
    # Each of the five chunks shares its step with the stream's decode row.
    assert round_kinds(driver).startswith("MMMMM")
    stream_rows = [s for s in driver.schedules[:5] if any(r.seq_id == 0 for r in s.rows)]
    assert len(stream_rows) == 5
    assert list(finished(stream).output_ids) == expected_output(prompt_of(3), 12)
