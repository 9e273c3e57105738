"""The local Response store: LRU bounds, continuation context, session keys, pagination."""
import pytest

from ninfer_jax.errors import InvalidRequest, NotFound
from ninfer_jax.serve.responses.store import (
    MIB, ResponseStore, build_record, json_size, page_items)


def _response(response_id, text="hi", size=0):
    output = [{"type": "message", "id": f"msg_{response_id}", "role": "assistant",
               "content": [{"type": "output_text", "text": text + "x" * size,
                            "annotations": []}]}]
    return {"id": response_id, "object": "response", "output": output}


def _input(item_id, text="q"):
    return {"type": "message", "id": item_id, "role": "user",
            "content": [{"type": "input_text", "text": text}]}


def _record(response_id, parent=None, size=0, stored=True):
    return build_record(_response(response_id, size=size), [_input(f"in_{response_id}")],
                        parent, None, stored)


def test_get_delete_and_not_found_code():
    store = ResponseStore(max_records=4, max_mib=1)
    store.put(_record("resp_a"))
    assert store.get("resp_a").response["id"] == "resp_a"
    store.delete("resp_a")
    with pytest.raises(NotFound) as info:
        store.get("resp_a", param="previous_response_id")
    assert info.value.code == "response_not_found"
    assert info.value.param == "previous_response_id"
    with pytest.raises(NotFound):
        store.delete("resp_a")
    assert store.stats() == {"records": 0, "bytes": 0}


def test_lru_by_record_count_refreshes_on_get():
    store = ResponseStore(max_records=2, max_mib=1)
    store.put(_record("resp_a"))
    store.put(_record("resp_b"))
    store.get("resp_a")  # a is now the most recent
    store.put(_record("resp_c"))
    store.get("resp_a")
    store.get("resp_c")
    with pytest.raises(NotFound):
        store.get("resp_b")


def test_lru_by_bytes():
    store = ResponseStore(max_records=100, max_mib=1)
    big = MIB // 3
    for name in ("resp_a", "resp_b", "resp_c", "resp_d"):
        store.put(_record(name, size=big))
    assert store.stats()["records"] == 2
    assert store.stats()["bytes"] <= MIB
    with pytest.raises(NotFound):
        store.get("resp_a")
    store.get("resp_d")


def test_single_response_over_capacity_fails_explicitly():
    store = ResponseStore(max_records=10, max_mib=1)
    store.put(_record("resp_small"))
    with pytest.raises(InvalidRequest) as info:
        store.put(_record("resp_huge", size=2 * MIB))
    assert info.value.code == "response_store_capacity_exceeded"
    store.get("resp_small")  # nothing was evicted for the failed put
    with pytest.raises(InvalidRequest):
        ResponseStore(max_records=0, max_mib=1).check_can_store()


def test_context_chains_and_survives_parent_deletion():
    store = ResponseStore(max_records=10, max_mib=4)
    root = _record("resp_root")
    store.put(root)
    child = _record("resp_child", parent=root)
    store.put(child)
    assert [item["id"] for item in child.context] == [
        "in_resp_root", "msg_resp_root", "in_resp_child", "msg_resp_child"]
    assert child.context_bytes == sum(json_size(item) for item in child.context)
    assert child.num_bytes == (json_size(child.response) + json_size(child.input_items[0])
                               + root.context_bytes)
    store.delete("resp_root")
    assert len(store.get("resp_child").context) == 4


def test_session_key_inherited_and_anonymous_for_unstored_roots():
    root = _record("resp_root")
    assert root.session_key == "resp_root"
    assert _record("resp_child", parent=root, stored=False).session_key == "resp_root"
    assert _record("resp_anon", stored=False).session_key is None


def test_page_items_orders_and_cursor():
    items = [{"id": f"item_{n}"} for n in range(5)]
    page = page_items(items, after=None, limit=2, order="asc")
    assert [i["id"] for i in page["data"]] == ["item_0", "item_1"]
    assert page["has_more"] and page["first_id"] == "item_0" and page["last_id"] == "item_1"
    page = page_items(items, after="item_1", limit=10, order="asc")
    assert [i["id"] for i in page["data"]] == ["item_2", "item_3", "item_4"]
    assert not page["has_more"]
    page = page_items(items, after="item_3", limit=2, order="desc")
    assert [i["id"] for i in page["data"]] == ["item_2", "item_1"]
    assert page["has_more"]
    with pytest.raises(InvalidRequest) as info:
        page_items(items, after="nope", limit=2, order="asc")
    assert info.value.param == "after"
