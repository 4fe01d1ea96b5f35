"""The schema is created and upgraded by Alembic when the store opens, on SQLite and PostgreSQL."""

import ast
import asyncio
import shutil
from datetime import UTC, date, datetime

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import bindparam, text

from app.accounts.auth import Caller, KeyVerifier
from app.accounts.keystore import Database, KeyStore, keygen, migrate
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.tables import Base, UtcDateTime
from app.accounts.keystore.usage import DailyTotal, UsageCount, UsageKey


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


NEXT_RELEASE = '''"""What a next release's migration may do: add a table, a nullable column, and a column
that old inserts leave to its default."""

import sqlalchemy as sa
from alembic import op

revision = "9999"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("next_release_things", sa.Column("id", sa.String(32), primary_key=True))
    op.add_column("api_keys", sa.Column("next_release_note", sa.String(64), nullable=True))
    op.add_column(
        "users", sa.Column("next_release_flag", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    pass
'''


async def test_this_release_serves_a_store_that_the_next_release_migrated(
    database_url: str, tmp_path
):
    """A rolling upgrade's old replicas, and a rollback, open and use a store one revision
    ahead of them: they serve it as it is (migrations only add) instead of failing to start on
    a revision they cannot find."""
    from alembic import command

    migrations = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "9999_next_release.py").write_text(NEXT_RELEASE.format(head=head()))
    database = await Database.open(database_url)
    store = KeyStore(database, max_keys_per_user=5)
    ada = await store.create_user("ada@example.com")
    before = await store.create_key(ada.id, "before")

    def next_release_upgrade(connection) -> None:
        config = migrate.alembic_config()
        config.set_main_option("script_location", str(migrations))
        config.attributes["connection"] = connection
        command.upgrade(config, "9999")

    async with database.engine.begin() as connection:
        await connection.run_sync(next_release_upgrade)
    await database.close()

    reopened = await Database.open(database_url)  # this release's upgrade: leaves it alone
    try:
        assert await current_revisions(reopened) == ["9999"]
        store = KeyStore(reopened, max_keys_per_user=5)
        verifier = KeyVerifier(store)
        after = await store.create_key(ada.id, "after")
        grace = await store.create_user("grace@example.com")
        for key in (before, after):
            assert (await verifier.verify(key.key)).user_id == ada.id
        await store.record_usage(
            {UsageKey(after.id, "ServiceAi-Fast", date.today()): UsageCount(1, 10, 5)}
        )
        assert (await store.usage(user=ada.id)).data[0].prompt_tokens == 10
        await store.revoke_key(before.id)
        assert [k.id for k in (await store.list_keys(ada.id)).data if k.revoked_at is None] == [
            after.id
        ]
        assert (await store.get_user(grace.email)).id == grace.id
    finally:
        await reopened.close()


ADDING = {"create_table", "create_index", "add_column", "batch_alter_table", "execute"}
"""What a migration's upgrade() may call on `op` (or a batch of it): an older release, whose
replicas still serve while the first new one migrates (and after a rollback), knows nothing
of what was added and relies on everything it had. A change that removes or renames is split
in two releases: the next one stops using the thing, the one after drops it (listed below)."""
SCHEMA_OPERATIONS = ADDING | {
    "drop_table",
    "drop_column",
    "alter_column",
    "rename_table",
    "drop_index",
    "drop_constraint",
    "create_unique_constraint",
    "create_check_constraint",
    "create_foreign_key",
    "create_primary_key",
}
CONTRACTING_REVISIONS: dict[str, str] = {}
"""Revisions allowed to remove or rename, each with the release that stopped using it."""


def test_every_migration_only_adds():
    for path in sorted((migrate.MIGRATIONS / "versions").glob("0*.py")):
        tree = ast.parse(path.read_text())
        [upgrade] = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "upgrade"]
        revision = path.name.split("_")[0]
        for call in (n for n in ast.walk(upgrade) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
            if name in SCHEMA_OPERATIONS:  # on `op` or on a batch of it
                assert name in ADDING or revision in CONTRACTING_REVISIONS, (
                    f"{path.name}: {name} removes or changes what an older release uses"
                )
            if name == "add_column":
                column = next(a for a in call.args if isinstance(a, ast.Call))
                keywords = {k.arg: k.value for k in column.keywords}
                nullable = keywords.get("nullable")
                not_null = isinstance(nullable, ast.Constant) and nullable.value is False
                assert not not_null or "server_default" in keywords, (
                    f"{path.name}: a NOT NULL column without a server default breaks an older "
                    "release's inserts"
                )
