"""The schema is created and upgraded by Alembic when the store opens, on SQLite and PostgreSQL."""

import asyncio
from datetime import UTC, date, datetime

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import bindparam, text

from app.accounts.auth import Caller, KeyVerifier
from app.accounts.keystore import Database, KeyStore, keygen, migrate
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.tables import Base, UtcDateTime
from app.accounts.keystore.usage import DailyTotal


async def current_revisions(database: Database) -> list[str]:
    async with database.engine.connect() as connection:
        return list(
            (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalars()
        )


def head() -> str:
    return ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()


async def test_the_migrations_build_exactly_the_tables_of_the_models(store: KeyStore):
    def differences(connection):
        return compare_metadata(MigrationContext.configure(connection), Base.metadata)

    async with store.database.engine.connect() as connection:
        assert await connection.run_sync(differences) == []
    assert await current_revisions(store.database) == [head()]


async def test_replicas_opening_a_new_store_together_upgrade_it_once(database_url: str):
    databases = await asyncio.gather(*(Database.open(database_url) for _ in range(4)))
    try:
        assert await current_revisions(databases[0]) == [head()]
        user = await KeyStore(databases[1]).create_user("ada@example.com")
        assert (await KeyStore(databases[3]).get_user(user.id)).email == "ada@example.com"
    finally:
        for database in databases:
            await database.close()


async def test_upgrading_from_the_first_revision_keeps_existing_keys_working(database_url: str):
    first = ScriptDirectory.from_config(migrate.alembic_config()).get_base()
    old = await Database.open(database_url, migrate_to=first)
    secret = keygen.issue().secret
    # Rows as the first revision's tables hold them, written without today's models.
    async with old.engine.begin() as connection:
        created = bindparam("created", datetime(2026, 1, 1, tzinfo=UTC), type_=UtcDateTime())
        await connection.execute(
            text(
                "INSERT INTO users (id, email, plan, created_at) "
                "VALUES ('user_old', 'old@example.com', 'pro', :created)"
            ).bindparams(created)
        )
        await connection.execute(
            text(
                "INSERT INTO api_keys (id, user_id, key_hash, display, name, created_at) "
                "VALUES ('key_old', 'user_old', :hash, :display, 'old', :created)"
            ).bindparams(created, hash=keygen.hash_key(secret), display=keygen.display_form(secret))
        )
    assert await current_revisions(old) == [first]
    await old.close()

    upgraded = await Database.open(database_url)
    try:
        assert await current_revisions(upgraded) == [head()]
        verifier = KeyVerifier(KeyStore(upgraded))
        assert await verifier.verify(secret) == Caller(
            key_id="key_old", user_id="user_old", plan="pro"
        )
    finally:
        await upgraded.close()


async def test_a_store_of_the_revision_before_key_scopes_upgrades_with_its_keys_intact(
    database_url: str,
):
    """A store as main made it before scopes (revision 0005, with a user, a key and its
    usage) upgrades: the key works with no scope, its usage stays, scopes can be set."""
    old = await Database.open(database_url, migrate_to="0005")
    secret = keygen.issue().secret
    # Rows as revision 0005's tables hold them, written without today's models.
    async with old.engine.begin() as connection:
        created = bindparam("created", datetime(2026, 1, 1, tzinfo=UTC), type_=UtcDateTime())
        await connection.execute(
            text(
                "INSERT INTO users (id, email, plan, created_at, session_version) "
                "VALUES ('user_old', 'old@example.com', 'pro', :created, 0)"
            ).bindparams(created)
        )
        await connection.execute(
            text(
                "INSERT INTO api_keys (id, user_id, key_hash, display, name, created_at) "
                "VALUES ('key_old', 'user_old', :hash, :display, 'old', :created)"
            ).bindparams(created, hash=keygen.hash_key(secret), display=keygen.display_form(secret))
        )
        await connection.execute(
            text(
                "INSERT INTO daily_usage (key_id, model_type, day, requests, prompt_tokens, "
                "completion_tokens) VALUES ('key_old', 'ServiceAi-Fast', :day, 3, 30, 40)"
            ),
            {"day": datetime.now(UTC).date()},
        )
    await old.close()

    upgraded = await Database.open(database_url)
    try:
        assert await current_revisions(upgraded) == [head()]
        store = KeyStore(upgraded)
        caller = await KeyVerifier(store).verify(secret)
        assert caller == Caller(key_id="key_old", user_id="user_old", plan="pro")
        assert (await store.monthly_tokens("key", "key_old")) == 70
        assert (await store.monthly_tokens("user", "user_old")) == 70
        key = await store.get_key("key_old")
        assert (key.models, key.expires_at, key.monthly_tokens) == (None, None, None)
        assert (await store.get_user("user_old")).monthly_tokens is None
        scoped = await store.update_key("key_old", {"models": ["ServiceAi-Coder"]})
        assert scoped.models == ["ServiceAi-Coder"]
    finally:
        await upgraded.close()


async def test_a_store_of_the_revision_before_roles_upgrades_to_plain_users_and_an_empty_log(
    database_url: str,
):
    """A store at revision 0006 (a user with a key and its usage) upgrades: the user is not an
    operator, the key works, the audit log is empty and takes entries, the user can be made an
    operator, and the usage already there is in everyone's daily totals."""
    old = await Database.open(database_url, migrate_to="0006")
    secret = keygen.issue().secret
    async with old.engine.begin() as connection:
        created = bindparam("created", datetime(2026, 1, 1, tzinfo=UTC), type_=UtcDateTime())
        await connection.execute(
            text(
                "INSERT INTO users (id, email, plan, created_at, session_version) "
                "VALUES ('user_old', 'old@example.com', 'pro', :created, 0)"
            ).bindparams(created)
        )
        await connection.execute(
            text(
                "INSERT INTO api_keys (id, user_id, key_hash, display, name, created_at) "
                "VALUES ('key_old', 'user_old', :hash, :display, 'old', :created)"
            ).bindparams(created, hash=keygen.hash_key(secret), display=keygen.display_form(secret))
        )
        await connection.execute(
            text(
                "INSERT INTO daily_usage (key_id, model_type, day, requests, prompt_tokens, "
                "completion_tokens) VALUES ('key_old', 'ServiceAi-Fast', :day, 3, 30, 40)"
            ),
            {"day": date(2026, 11, 20)},
        )
    await old.close()

    upgraded = await Database.open(database_url)
    try:
        assert await current_revisions(upgraded) == [head()]
        store = KeyStore(upgraded)
        assert await store.daily_totals(date(2026, 11, 1), date(2026, 11, 30)) == [
            DailyTotal(date(2026, 11, 20), "ServiceAi-Fast", 3, 30, 40)
        ]
        assert (await store.get_user("user_old")).role == "user"
        caller = await KeyVerifier(store).verify(secret)
        assert caller == Caller(key_id="key_old", user_id="user_old", plan="pro")
        assert (await store.audit_log()).data == []
        await store.update_user("user_old", role="admin", actor=Actor.command_line())
        assert (await store.get_user("old@example.com")).role == "admin"
        [entry] = (await store.audit_log()).data
        assert (entry.source, entry.action, entry.target) == (
            "cli",
            "user.set_role",
            "old@example.com",
        )
    finally:
        await upgraded.close()


async def test_a_store_before_key_management_keeps_it_for_unscoped_keys_only(database_url: str):
    """A store at revision 0009 upgrades: an unscoped key still manages its user's keys; a
    scoped one (a model list, an expiry, limits, a budget), as a CI key is, no longer does."""
    old = await Database.open(database_url, migrate_to="0009")
    async with old.engine.begin() as connection:
        created = bindparam("created", datetime(2026, 1, 1, tzinfo=UTC), type_=UtcDateTime())
        await connection.execute(
            text(
                "INSERT INTO users (id, email, plan, created_at, session_version, role) "
                "VALUES ('user_old', 'old@example.com', 'pro', :created, 0, 'user')"
            ).bindparams(created)
        )
        for key_id, scopes in [
            ("key_plain", {}),
            ("key_models", {"models": '["ServiceAi-Coder"]'}),
            ("key_budget", {"monthly_tokens": 500}),
        ]:
            secret = keygen.issue().secret
            columns = "".join(f", {name}" for name in scopes)
            values = "".join(f", :{name}" for name in scopes)
            await connection.execute(
                text(
                    f"INSERT INTO api_keys (id, user_id, key_hash, display, name, created_at"
                    f"{columns}) VALUES ('{key_id}', 'user_old', :hash, :display, 'k', "
                    f":created{values})"
                ).bindparams(
                    created,
                    hash=keygen.hash_key(secret),
                    display=keygen.display_form(secret),
                    **scopes,
                )
            )
    await old.close()

    upgraded = await Database.open(database_url)
    try:
        store = KeyStore(upgraded)
        keys = {key.id: key.manage_keys for key in (await store.list_keys("user_old")).data}
        assert keys == {"key_plain": True, "key_models": False, "key_budget": False}
    finally:
        await upgraded.close()
