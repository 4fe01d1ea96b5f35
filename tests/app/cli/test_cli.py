"""`serviceai users ...`, `serviceai keys ...` and `serviceai adapters ...` against a real store (SQLite and PostgreSQL);
`serviceai run` refusing a port it cannot use."""

import asyncio
import json
import os
import shutil
import socket
import tempfile
from datetime import UTC, date, datetime, timedelta

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from app.accounts.keystore import Database, KeyStore, keygen
from app.accounts.keystore.errors import WrongCredentials
from app.accounts.keystore.usage import UsageCount, UsageKey
from app.cli.common import EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE
from app.cli.main import cli
from app.config.settings import get_settings


@pytest.fixture
def serviceai(database_url, monkeypatch):
    """Runs `serviceai ARGS` on the test database; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("SERVICEAI_DATABASE_URL", database_url)
    get_settings.cache_clear()
    runner = CliRunner()

    def run(*args: str, input: str | None = None):
        get_settings.cache_clear()
        result = runner.invoke(cli, list(args), input=input)
        return result.exit_code, result.stdout, result.stderr

    yield run
    get_settings.cache_clear()


def json_of(result) -> dict:
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


def test_one_command_creates_an_account_with_a_key(serviceai):
    created = json_of(
        serviceai("users", "create", "--email", "Ada@Example.com", "--with-key", "--json")
    )
    user, key = created["user"], created["key"]
    assert (user["email"], user["plan"]) == ("ada@example.com", "free")
    assert (
        keygen.is_well_formed(key["key"])
        and key["user_id"] == user["id"]
        and key["name"] == "default"
    )

    code, out, _ = serviceai(
        "users", "create", "--email", "bob@example.com", "--plan", "pro", "--with-key"
    )
    assert code == 0 and "plan pro" in out and "not shown again" in out
    [secret] = [line.strip() for line in out.splitlines() if line.strip().startswith("sai-")]
    assert keygen.is_well_formed(secret)


def test_keys_create_list_revoke(serviceai):
    user = json_of(serviceai("users", "create", "--email", "ada@example.com", "--json"))
    key = json_of(
        serviceai("keys", "create", "--user", "ada@example.com", "--name", "ci", "--json")
    )
    assert key["name"] == "ci" and key["user_id"] == user["id"]

    code, out, _ = serviceai("keys", "list", "--user", user["id"])
    assert code == 0 and key["id"] in out and key["display"] in out and "active" in out
    assert key["key"] not in out
    listed = json_of(serviceai("keys", "list", "--json"))
    assert [k["id"] for k in listed["data"]] == [key["id"]] and "key" not in listed["data"][0]

    code, out, _ = serviceai("keys", "revoke", key["id"])
    assert code == 0 and "Revoked" in out
    assert json_of(serviceai("keys", "list", "--json"))["data"][0]["revoked"] is True


def test_users_list_disable_enable_set_plan(serviceai):
    ada = json_of(serviceai("users", "create", "--email", "ada@example.com", "--json"))
    assert json_of(serviceai("users", "disable", "ada@example.com", "--json"))["disabled"] is True
    code, out, _ = serviceai("users", "list")
    assert code == 0 and ada["id"] in out and "disabled" in out
    assert json_of(serviceai("users", "enable", ada["id"], "--json"))["disabled"] is False
    assert json_of(serviceai("users", "set-plan", ada["id"], "pro", "--json"))["plan"] == "pro"
    assert [u["email"] for u in json_of(serviceai("users", "list", "--json"))["data"]] == [
        "ada@example.com"
    ]
    json_of(serviceai("users", "create", "--email", "bob@example.com", "--json"))
    newest = json_of(serviceai("users", "list", "--order", "desc", "--json"))["data"]
    assert [u["email"] for u in newest] == ["bob@example.com", "ada@example.com"]
    code, _, err = serviceai("users", "list", "--order", "newest")
    assert code == EXIT_USAGE and "--order" in err


def test_set_role_makes_an_operator_and_every_change_is_audited_as_the_cli(serviceai, database_url):
    json_of(serviceai("users", "create", "--email", "ada@example.com", "--json"))
    assert (
        json_of(serviceai("users", "set-role", "ada@example.com", "admin", "--json"))["role"]
        == "admin"
    )
    code, out, _ = serviceai("users", "set-role", "ada@example.com", "user")
    assert code == 0 and "operator" not in out
    code, _, err = serviceai("users", "set-role", "ada@example.com", "root")
    assert code == EXIT_USAGE and "--role" in err

    async def log():
        store = KeyStore(await Database.open(database_url))
        try:
            return (await store.audit_log()).data
        finally:
            await store.database.close()

    entries = asyncio.run(log())
    assert [(e.source, e.action, e.detail) for e in entries] == [
        ("cli", "user.set_role", "admin → user"),
        ("cli", "user.set_role", "user → admin"),
        ("cli", "user.create", "plan free"),
    ]

    # `serviceai audit` reads the same log: the JSON the admin API returns, pages, a table.
    listed = json_of(serviceai("audit", "--json"))
    assert [e["id"] for e in listed["data"]] == [e.id for e in entries] and not listed["has_more"]
    first = json_of(serviceai("audit", "--limit", "2", "--json"))
    assert [e["action"] for e in first["data"]] == ["user.set_role", "user.set_role"]
    assert first["has_more"]
    code, out, _ = serviceai("audit", "--limit", "2")
    assert code == 0 and f"--before {first['data'][-1]['id']}" in out and "admin → user" in out
    rest = json_of(serviceai("audit", "--before", str(first["data"][-1]["id"]), "--json"))
    assert [e["detail"] for e in rest["data"]] == ["plan free"] and not rest["has_more"]
    code, _, err = serviceai("audit", "--before", "0")
    assert code == EXIT_USAGE and "--before" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("users", "create", "--email", "nope"), EXIT_USAGE, "--email: is not an email address"),
        (("users", "create", "--email", "a@b.c", "--plan", "Gold"), EXIT_USAGE, "--plan"),
        (("keys", "create", "--user", "nobody@example.com"), EXIT_REFUSED, "No user with email"),
        (("keys", "revoke", "key_missing"), EXIT_REFUSED, "No API key with id 'key_missing'"),
        (("users", "disable", "user_missing"), EXIT_REFUSED, "No user with id"),
        (("keys", "create"), EXIT_USAGE, "Missing option '--user'"),
    ],
)
def test_friendly_errors_and_exit_codes(serviceai, args, code, message):
    exit_code, out, err = serviceai(*args)
    assert exit_code == code
    assert message in err and "Traceback" not in err + out


def test_an_existing_email_is_refused(serviceai):
    serviceai("users", "create", "--email", "ada@example.com")
    code, _, err = serviceai("users", "create", "--email", "ADA@example.com")
    assert code == EXIT_REFUSED and "already exists" in err


def test_unreachable_store_and_bad_configuration(serviceai, monkeypatch):
    monkeypatch.setenv("SERVICEAI_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    code, _, err = serviceai("users", "list")
    assert code == EXIT_UNAVAILABLE and "unavailable" in err
    monkeypatch.setenv("SERVICEAI_DATABASE_URL", "mysql://somewhere/db")
    code, _, err = serviceai("users", "list")
    assert code == EXIT_USAGE and "SERVICEAI_DATABASE_URL" in err and "somewhere" not in err


def all_command_paths(command, prefix=()):
    yield prefix
    for name, sub in getattr(command, "commands", {}).items():
        yield from all_command_paths(sub, (*prefix, name))


@pytest.mark.parametrize("path", list(all_command_paths(get_command(cli))), ids=" ".join)
def test_help_everywhere(path):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.stdout


async def test_make_run_creates_a_local_key_on_the_first_start_only(store):
    from app.accounts.auth import KeyVerifier
    from app.cli.main import LOCAL_USER, _first_start_key

    key, owner = await _first_start_key(store)
    caller = await KeyVerifier(store).verify(key)
    assert owner == LOCAL_USER and caller.user_id == (await store.get_user(LOCAL_USER)).id
    assert await _first_start_key(store) == (None, LOCAL_USER)


async def test_make_run_leaves_a_store_with_users_alone(store):
    from app.cli.main import _first_start_key

    await store.create_user("ops@example.com")
    assert await _first_start_key(store) == (None, "<your email>")
    assert [u.email for u in (await store.list_users()).data] == ["ops@example.com"]


def test_usage_shows_the_same_json_as_the_admin_api_and_a_table(serviceai, database_url):
    ada = json_of(
        serviceai("users", "create", "--email", "ada@example.com", "--with-key", "--json")
    )
    key_id = ada["key"]["id"]

    async def record() -> None:
        database = await Database.open(database_url)
        try:
            usage = {UsageKey(key_id, "ServiceAi-Pro", date(2026, 11, 20)): UsageCount(3, 30, 12)}
            await KeyStore(database).record_usage(usage)
        finally:
            await database.close()

    asyncio.run(record())
    report = json_of(
        serviceai(
            "usage",
            "--user",
            "ada@example.com",
            "--start-date",
            "2026-11-20",
            "--end-date",
            "2026-11-20",
            "--json",
        )
    )
    assert report["data"] == [
        {
            "object": "usage",
            "date": "2026-11-20",
            "user_id": ada["user"]["id"],
            "key_id": key_id,
            "model": "ServiceAi-Pro",
            "requests": 3,
            "prompt_tokens": 30,
            "completion_tokens": 12,
            "total_tokens": 42,
        }
    ]
    code, out, _ = serviceai(
        "usage", "--key", key_id, "--start-date", "2026-11-01", "--end-date", "2026-11-30"
    )
    assert code == 0 and "ServiceAi-Pro" in out
    assert "3 requests, 30 prompt + 12 completion = 42 tokens" in out
    code, _, err = serviceai("usage", "--start-date", "2026-11-21", "--end-date", "2026-11-20")
    assert code == EXIT_REFUSED and "after" in err


def signs_in(database_url: str, email: str, password: str) -> bool:
    async def check() -> bool:
        database = await Database.open(database_url)
        try:
            await KeyStore(database).check_password(email, password)
            return True
        except WrongCredentials:
            return False
        finally:
            await database.close()

    return asyncio.run(check())


def test_set_password_lets_a_cli_user_sign_in_to_the_console(serviceai, database_url):
    json_of(serviceai("users", "create", "--email", "ops@example.com", "--json"))
    code, _, err = serviceai(
        "users", "set-password", "ops@example.com", "--password-stdin", input="short\n"
    )
    assert code == EXIT_USAGE and "--password" in err and "10 characters" in err
    code, out, _ = serviceai(
        "users",
        "set-password",
        "ops@example.com",
        "--password-stdin",
        input="a long enough password\n",
    )
    assert code == 0 and "can now sign in to the console" in out
    assert signs_in(database_url, "ops@example.com", "a long enough password")
    code, out, _ = serviceai(
        "users",
        "set-password",
        "ops@example.com",
        input="another long password\nanother long password\n",
    )
    assert code == 0 and "another long password" not in out
    assert signs_in(database_url, "ops@example.com", "another long password")
    assert not signs_in(database_url, "ops@example.com", "a long enough password")
    code, _, err = serviceai(
        "users",
        "set-password",
        "nobody@example.com",
        "--password-stdin",
        input="a long enough password\n",
    )
    assert code == EXIT_REFUSED and "No user" in err


def test_run_refuses_a_port_another_program_holds_naming_it():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        try:
            result = CliRunner().invoke(cli, ["run", "--port", str(port)])
        finally:
            shutil.rmtree(os.path.join(tempfile.gettempdir(), f"sai-h-{port}"), ignore_errors=True)
    assert result.exit_code == 2
    assert f"Port {port} is in use by another program (pid {os.getpid()}: " in result.stderr
    assert f"kill {os.getpid()}" in result.stderr and "Traceback" not in result.output


def test_keys_scoped_updated_and_rotated_from_the_cli(serviceai):
    json_of(serviceai("users", "create", "--email", "ada@example.com", "--json"))
    key = json_of(
        serviceai(
            "keys",
            "create",
            "--user",
            "ada@example.com",
            "--name",
            "contractor",
            "--models",
            "ServiceAi-Fast,ServiceAi-Coder",
            "--expires-at",
            "2099-01-31T00:00:00Z",
            "--requests-per-minute",
            "5",
            "--tokens-per-minute",
            "5000",
            "--concurrent-requests",
            "2",
            "--tokens-per-day",
            "50000",
            "--monthly-tokens",
            "100000",
            "--json",
        )
    )
    assert key["models"] == ["ServiceAi-Fast", "ServiceAi-Coder"]
    assert key["expires_at"] == "2099-01-31T00:00:00Z" and key["monthly_tokens"] == 100000
    assert key["limits"] == {
        "requests_per_minute": 5,
        "tokens_per_minute": 5000,
        "concurrent_requests": 2,
        "tokens_per_day": 50000,
    }

    # One limit given changes that limit only; --all-models and --no-expiry clear.
    updated = json_of(
        serviceai(
            "keys",
            "update",
            key["id"],
            "--tokens-per-minute",
            "700",
            "--all-models",
            "--expires-in",
            "30d",
            "--json",
        )
    )
    assert updated["models"] is None and updated["limits"]["tokens_per_minute"] == 700
    assert updated["limits"]["requests_per_minute"] == 5
    expires = datetime.fromisoformat(updated["expires_at"])
    assert timedelta(days=29, hours=23) < expires - datetime.now(UTC) <= timedelta(days=30)
    code, out, _ = serviceai("keys", "update", key["id"], "--no-expiry")
    assert code == 0 and "expires: never" in out and "tokens_per_minute 700" in out

    rotated = json_of(serviceai("keys", "rotate", key["id"], "--grace", "0s", "--json"))
    assert rotated["name"] == "contractor" and rotated["limits"] == updated["limits"]
    listed = {k["id"]: k for k in json_of(serviceai("keys", "list", "--json"))["data"]}
    assert listed[key["id"]]["revoked"] is True and listed[rotated["id"]]["revoked"] is False

    for args, message in (
        (("--expires-in", "soon"), "--expires-in"),
        (("--requests-per-minute", "0"), "requests-per-minute"),
        (("--expires-in", "1d", "--expires-at", "2099-01-01T00:00:00Z"), "not both"),
    ):
        code, _, err = serviceai("keys", "create", "--user", "ada@example.com", *args)
        assert code == EXIT_USAGE and message in err, err


def test_a_users_monthly_budget_from_the_cli_and_in_the_usage_report(serviceai):
    json_of(serviceai("users", "create", "--email", "ada@example.com", "--json"))
    user = json_of(
        serviceai("users", "set-budget", "ada@example.com", "--monthly-tokens", "5000", "--json")
    )
    assert user["monthly_tokens"] == 5000
    report = json_of(serviceai("usage", "--user", "ada@example.com", "--json"))
    assert report["budget"]["monthly_tokens"] == 5000 and report["budget"]["left"] == 5000
    code, out, _ = serviceai("usage", "--user", "ada@example.com")
    assert code == 0 and "0 of 5000 tokens used, 5000 left" in out
    assert (
        json_of(serviceai("users", "set-budget", "ada@example.com", "--none", "--json"))[
            "monthly_tokens"
        ]
        is None
    )
    code, _, err = serviceai("users", "set-budget", "ada@example.com")
    assert code == EXIT_USAGE and "--none" in err


def test_adapters_are_registered_listed_and_removed(serviceai, monkeypatch):
    monkeypatch.setenv("SERVICEAI_ADAPTER_ROOTS", '["/models"]')
    code, out, err = serviceai("adapters", "add", "T", "beta", "/models/beta")
    assert code == 0, err
    assert "Registered T:beta (/models/beta)" in out
    assert serviceai("adapters", "add", "T", "beta", "/models/other")[0] == EXIT_REFUSED
    assert serviceai("adapters", "add", "T", "no way", "/models/x")[0] == EXIT_USAGE
    code, _, err = serviceai("adapters", "add", "T", "gamma", "/etc/ssh")
    assert code == EXIT_USAGE and "SERVICEAI_ADAPTER_ROOTS" in err
    listed = json_of(serviceai("adapters", "list", "--json"))
    assert [(a["id"], a["path"]) for a in listed["data"]] == [("T:beta", "/models/beta")]
    assert serviceai("adapters", "remove", "T:beta")[0] == 0
    assert serviceai("adapters", "remove", "T:beta")[0] == EXIT_REFUSED


def test_the_console_names_the_address_a_run_listens_on():
    from app.cli.main import _public_base_url

    assert _public_base_url("127.0.0.1", 9000) == {
        "SERVICEAI_PUBLIC_BASE_URL": "http://127.0.0.1:9000/v1"
    }
    assert _public_base_url("0.0.0.0", 8000)["SERVICEAI_PUBLIC_BASE_URL"] == (
        "http://127.0.0.1:8000/v1"
    )
