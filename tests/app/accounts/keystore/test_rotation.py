"""docs/operations.md, "Rotating secrets": the database password changes without downtime by
two login roles taking turns. The second role acts as the first (the tables' owner), so the
service and its migrations run under either alike: what one made, the other reads, writes and
owns."""

from __future__ import annotations

import secrets

import asyncpg
import pytest
from sqlalchemy import text

from app.accounts.auth import KeyVerifier
from app.accounts.keystore import Database, KeyStore
from tests.conftest import POSTGRES


@pytest.fixture
async def turns(postgres):
    """A database owned by a login role of its own (`serviceai`'s part), and the admin
    connection that makes the second role; both roles dropped afterwards."""
    suffix = secrets.token_hex(4)
    first, second = f"serviceai_{suffix}", f"serviceai_{suffix}_b"
    url = await postgres.create()
    database = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(POSTGRES)
    await admin.execute(f"CREATE ROLE {first} LOGIN PASSWORD 'first-password'")
    await admin.execute(f'ALTER DATABASE "{database}" OWNER TO {first}')
    await admin.execute(f'GRANT ALL ON DATABASE "{database}" TO {first}')
    owner_db = await asyncpg.connect(POSTGRES.rsplit("/", 1)[0] + f"/{database}")
    await owner_db.execute(f"ALTER SCHEMA public OWNER TO {first}")
    await owner_db.close()

    def as_role(role: str) -> str:
        server = url.rsplit("/", 1)[0].replace("postgres@", f"{role}@", 1)
        return f"{server}/{database}"

    yield admin, first, second, as_role
    # Roles are the server's: give what they own back, then drop them (the database is
    # dropped with the others at the end of the session).
    owner_db = await asyncpg.connect(POSTGRES.rsplit("/", 1)[0] + f"/{database}")
    await owner_db.execute(f"REASSIGN OWNED BY {first} TO CURRENT_USER")
    await owner_db.execute(f"DROP OWNED BY {first}")
    await owner_db.close()
    await admin.execute(f"DROP OWNED BY {first}")
    for role in (second, first):
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
    await admin.close()


async def test_the_second_role_serves_the_store_and_owns_what_it_migrates_as_the_first(turns):
    admin, first, second, as_role = turns
    database = await Database.open(as_role(first))  # the first turn: migrates, owns the tables
    store = KeyStore(database, max_keys_per_user=5)
    ada = await store.create_user("ada@example.com")
    before = await store.create_key(ada.id, "before")
    await database.close()

    # The runbook's two statements, then the service switched to the second role.
    await admin.execute(f"CREATE ROLE {second} LOGIN PASSWORD 'second-password' IN ROLE {first}")
    await admin.execute(f"ALTER ROLE {second} SET role = '{first}'")
    database = await Database.open(as_role(second))
    try:
        store = KeyStore(database, max_keys_per_user=5)
        assert (await KeyVerifier(store).verify(before.key)).user_id == ada.id
        after = await store.create_key(ada.id, "after")
        await store.revoke_key(before.id)
        # A migration of the next release, run under the second role, makes its table as the
        # first: the next turn (back to the first role) owns and alters it.
        async with database.engine.begin() as connection:
            await connection.execute(text("CREATE TABLE next_release (id text PRIMARY KEY)"))
            owners = await connection.execute(
                text("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
            )
            assert set(owners.scalars()) == {first}
    finally:
        await database.close()

    # The first role's turn again (its password changed: `ALTER ROLE ... PASSWORD`).
    await admin.execute(f"ALTER ROLE {first} PASSWORD 'third-password'")
    database = await Database.open(as_role(first))
    try:
        store = KeyStore(database, max_keys_per_user=5)
        assert (await KeyVerifier(store).verify(after.key)).key_id == after.id
        async with database.engine.begin() as connection:
            await connection.execute(text("ALTER TABLE next_release ADD COLUMN note text"))
    finally:
        await database.close()
