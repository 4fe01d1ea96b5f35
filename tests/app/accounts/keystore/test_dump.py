"""A dump of the database holds no usable key: only hashes and display forms."""

import re
import sqlite3
import subprocess

from app.accounts.keystore import KeyStore, keygen

USABLE_KEY = re.compile(r"sai-[A-Za-z0-9_-]{43}")


def dump(database_url: str) -> str:
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.partition(":///")[2]) as connection:
            return "\n".join(connection.iterdump())
    server, name = database_url.replace("+asyncpg", "").rsplit("/", 1)
    return subprocess.run(
        ["pg_dump", "--dbname", f"{server}/{name}"], check=True, capture_output=True, text=True
    ).stdout


async def test_a_dump_contains_no_usable_key(store: KeyStore, database_url: str):
    ada = await store.create_user("ada@example.com")
    issued = [await store.create_key(ada.id, f"key {i}") for i in range(3)]
    await store.revoke_key(issued[0].id)
    text = dump(database_url)
    for key in issued:
        assert keygen.hash_key(key.key) in text  # the dump does hold the keys table
        assert key.display in text
        assert key.key not in text and key.key[4:] not in text
    assert USABLE_KEY.search(text) is None
