"""Stored responses on SQLite and PostgreSQL: owned, paged, expired, purged, capped."""

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.accounts.keystore import KeyStore
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.responses import ResponseNotFound, ResponseStore, ResponseTooLarge
from app.accounts.keystore.tables import StoredResponseRow


def items(count: int) -> list[dict]:
    return [
        {
            "id": f"msg_{i}",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"turn {i}"}],
        }
        for i in range(count)
    ]


def body(response_id: str, text: str = "hello") -> dict:
    return {
        "id": response_id,
        "object": "response",
        "status": "completed",
        "output": [
            {
                "id": f"msg_out_{response_id}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
    }


@pytest.fixture
async def users(store: KeyStore) -> tuple[str, str]:
    ada = await store.create_user("ada@example.com")
    bob = await store.create_user("bob@example.com")
    return ada.id, bob.id


@pytest.fixture
def responses(store: KeyStore) -> ResponseStore:
    return ResponseStore(store.database, retention_s=3600, max_bytes=64 * 1024)


async def test_a_saved_response_is_read_back_whole_by_its_owner(responses, users):
    ada, _ = users
    await responses.save(ada, items(2), body("resp_1"))
    stored = await responses.get(ada, "resp_1")
    assert stored.body == body("resp_1")
    assert stored.input_items == items(2)
    # The next turn replays this turn's input, then its output.
    assert stored.conversation() == [*items(2), *body("resp_1")["output"]]


async def test_another_user_finds_nothing_on_any_operation(responses, users):
    ada, bob = users
    await responses.save(ada, items(1), body("resp_1"))
    with pytest.raises(ResponseNotFound) as found:
        await responses.get(bob, "resp_1", param="previous_response_id")
    assert (found.value.status, found.value.param) == (404, "previous_response_id")
    with pytest.raises(ResponseNotFound):
        await responses.input_items(bob, "resp_1")
    with pytest.raises(ResponseNotFound):
        await responses.delete(bob, "resp_1")
    assert (await responses.get(ada, "resp_1")).id == "resp_1"  # bob's delete did nothing


async def test_delete_removes_it_for_good(responses, users):
    ada, _ = users
    await responses.save(ada, items(1), body("resp_1"))
    await responses.delete(ada, "resp_1")
    with pytest.raises(ResponseNotFound):
        await responses.get(ada, "resp_1")
    with pytest.raises(ResponseNotFound):
        await responses.delete(ada, "resp_1")


async def test_input_items_page_newest_first_by_default_and_after_an_id(responses, users):
    ada, _ = users
    await responses.save(ada, items(5), body("resp_1"))
    first = await responses.input_items(ada, "resp_1", limit=2)
    assert [i["id"] for i in first.data] == ["msg_4", "msg_3"] and first.has_more
    second = await responses.input_items(ada, "resp_1", limit=2, after="msg_3")
    assert [i["id"] for i in second.data] == ["msg_2", "msg_1"] and second.has_more
    last = await responses.input_items(ada, "resp_1", limit=2, after="msg_1")
    assert [i["id"] for i in last.data] == ["msg_0"] and not last.has_more
    ascending = await responses.input_items(ada, "resp_1", limit=10, order="asc")
    assert [i["id"] for i in ascending.data] == [f"msg_{i}" for i in range(5)]
    assert ascending.as_list()["first_id"] == "msg_0" and ascending.as_list()["last_id"] == "msg_4"
    with pytest.raises(KeyStoreError) as wrong:
        await responses.input_items(ada, "resp_1", after="msg_nope")
    assert wrong.value.param == "after"


async def test_an_expired_response_is_gone_at_once_and_purged(responses, users, store):
    ada, _ = users
    await responses.save(ada, items(1), body("resp_old"))
    await responses.save(ada, items(1), body("resp_new"))
    async with store.database.transaction() as session:
        row = await session.get(StoredResponseRow, "resp_old")
        row.expires_at = row.created_at - timedelta(seconds=1)
    with pytest.raises(ResponseNotFound):
        await responses.get(ada, "resp_old")
    assert await responses.purge() == 1
    async with store.database.transaction() as session:
        left = list(await session.scalars(select(StoredResponseRow.id)))
    assert left == ["resp_new"]


async def test_retention_sets_the_expiry(store, users):
    ada, _ = users
    short = ResponseStore(store.database, retention_s=60)
    await short.save(ada, items(1), body("resp_1"))
    async with store.database.transaction() as session:
        row = await session.get(StoredResponseRow, "resp_1")
    assert row.expires_at - row.created_at == timedelta(seconds=60)


async def test_the_size_cap_refuses_an_input_up_front_and_a_reply_that_overflows(responses, users):
    ada, _ = users
    huge = [
        {
            "id": "msg_0",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "x" * 70_000}],
        }
    ]
    with pytest.raises(ResponseTooLarge) as refused:
        responses.check_size(huge)
    assert (refused.value.status, refused.value.param) == (400, "input")
    responses.check_size(items(3))
    with pytest.raises(ResponseTooLarge):
        await responses.save(ada, items(1), body("resp_1", text="y" * 70_000))
    with pytest.raises(ResponseNotFound):
        await responses.get(ada, "resp_1")


async def test_a_background_response_moves_on_by_conditional_updates(responses, users):
    ada, bob = users
    queued = {"id": "resp_bg", "object": "response", "status": "queued", "background": True}
    await responses.save(ada, items(1), queued)
    assert (await responses.get(ada, "resp_bg")).status == "queued"
    assert await responses.start(ada, "resp_bg") and not await responses.start(ada, "resp_bg")
    assert (await responses.get(ada, "resp_bg")).body["status"] == "in_progress"
    with pytest.raises(ResponseNotFound):
        await responses.cancel(bob, "resp_bg")  # another user's: not there
    assert await responses.finish(ada, {**body("resp_bg"), "background": True}, 10)
    done = await responses.get(ada, "resp_bg")
    assert (done.status, done.body["output"][0]["content"][0]["text"]) == ("completed", "hello")
    # Ended: a cancel leaves it as it is, and nothing finishes it again.
    assert (await responses.cancel(ada, "resp_bg")).status == "completed"
    assert not await responses.finish(ada, {**body("resp_bg"), "status": "failed"}, 10)


async def test_a_cancelled_background_response_stays_cancelled(responses, users):
    ada, _ = users
    queued = {"id": "resp_c", "status": "queued", "background": True, "output": []}
    await responses.save(ada, items(1), queued)
    cancelled = await responses.cancel(ada, "resp_c")
    assert (cancelled.status, cancelled.body["status"]) == ("cancelled", "cancelled")
    assert await responses.status(ada, "resp_c") == "cancelled"
    assert not await responses.finish(ada, {**body("resp_c"), "background": True}, 10)
    assert (await responses.get(ada, "resp_c")).body["output"] == []


async def test_only_a_background_response_can_be_cancelled(responses, users):
    ada, _ = users
    await responses.save(ada, items(1), body("resp_fg"))
    with pytest.raises(KeyStoreError, match="only a background response"):
        await responses.cancel(ada, "resp_fg")
