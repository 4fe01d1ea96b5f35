"""The key store's users: accounts, plans, roles, budgets, console passwords and sessions."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.accounts.keystore import audit, keygen, passwords
from app.accounts.keystore.audit import Actor
from app.accounts.keystore.database import Database
from app.accounts.keystore.errors import UserExists, WrongCredentials
from app.accounts.keystore.rows import UNCHANGED, Unchanged, find_user, now, page, user_of
from app.accounts.keystore.schemas import DEFAULT_PLAN, Order, Page, Role, User
from app.accounts.keystore.tables import UserRow


class UserRecords:
    """Users, in the store's database."""

    database: Database

    async def create_user(
        self,
        email: str,
        plan: str = DEFAULT_PLAN,
        *,
        password: str | None = None,
        disabled: bool = False,
        actor: Actor | None = None,
    ) -> User:
        """A new user; with `password`, one who can sign in to the console; `disabled`, one
        an operator has yet to enable; with `actor`, an operator's action, audited."""
        email = email.strip().lower()
        password_hash = None if password is None else await passwords.hash_password(password)
        row = UserRow(
            id=keygen.new_id("user"),
            email=email,
            plan=plan,
            created_at=now(),
            password_hash=password_hash,
            role="user",
        )
        row.disabled_at = row.created_at if disabled else None
        try:
            async with self.database.transaction() as session:
                session.add(row)
                await session.flush()  # a taken email fails here, before the audit entry
                audit.record(session, actor, "user.create", email, f"plan {plan}")
        except IntegrityError:
            raise UserExists(
                f"A user with email '{email}' already exists.", param="email"
            ) from None
        return user_of(row)

    async def get_user(self, user: str) -> User:
        """A user by id or by email."""
        async with self.database.transaction() as session:
            return user_of(await find_user(session, user))

    async def list_users(
        self,
        limit: int = 100,
        after: str | None = None,
        *,
        email_contains: str | None = None,
        order: Order = "asc",
    ) -> Page[User]:
        """Users, oldest first (`desc`: newest first); with `email_contains`, those whose email
        holds that text."""
        query = select(UserRow)
        if email_contains:
            pattern = email_contains.strip().lower().replace("\\", "\\\\")
            pattern = pattern.replace("%", "\\%").replace("_", "\\_")
            query = query.where(UserRow.email.like(f"%{pattern}%", escape="\\"))
        async with self.database.transaction() as session:
            query = await page(session, query, UserRow, limit, after, order)
            rows = list(await session.scalars(query))
        return Page[User](data=[user_of(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def update_user(
        self,
        user: str,
        *,
        plan: str | None = None,
        disabled: bool | None = None,
        monthly_tokens: int | None | Unchanged = UNCHANGED,
        role: Role | None = None,
        actor: Actor | None = None,
    ) -> User:
        """Change what is given; `monthly_tokens=None` clears the user's budget. With `actor`,
        each change is an audited operator action."""
        async with self.database.transaction() as session:
            row = await find_user(session, user)
            if plan is not None:
                audit.record(session, actor, "user.set_plan", row.email, f"{row.plan} → {plan}")
                row.plan = plan
            if disabled is not None:
                audit.record(
                    session, actor, "user.disable" if disabled else "user.enable", row.email
                )
                if disabled != (row.disabled_at is not None):
                    row.disabled_at = now() if disabled else None
            if not isinstance(monthly_tokens, Unchanged):
                audit.record(
                    session,
                    actor,
                    "user.set_budget",
                    row.email,
                    f"{row.monthly_tokens} → {monthly_tokens} tokens a month",
                )
                row.monthly_tokens = monthly_tokens
            if role is not None:
                audit.record(session, actor, "user.set_role", row.email, f"{row.role} → {role}")
                row.role = role
        return user_of(row)

    async def set_password(
        self, user: str, password: str, *, end_sessions: bool = True, actor: Actor | None = None
    ) -> User:
        """Set (or replace) a user's console password: how CLI-made users get one. Every
        console session of the user ends (unless only the hash's parameters change)."""
        password_hash = await passwords.hash_password(password)
        async with self.database.transaction() as session:
            row = await find_user(session, user)
            audit.record(session, actor, "user.set_password", row.email)
            row.password_hash = password_hash
            if end_sessions:
                row.session_version = UserRow.session_version + 1
        return await self.get_user(row.id)

    async def emails(self, user_ids: Collection[str]) -> dict[str, str]:
        """The email of each of these users (by id), in one query."""
        if not user_ids:
            return {}
        query = select(UserRow.id, UserRow.email).where(UserRow.id.in_(list(user_ids)))
        async with self.database.connection() as connection:
            return dict((await connection.execute(query)).all())

    async def session_version(self, user_id: str) -> int | None:
        """The version a console session of this user must carry; None for no such user."""
        async with self.database.connection() as connection:
            return await connection.scalar(
                select(UserRow.session_version).where(UserRow.id == user_id)
            )

    async def end_sessions(self, user_id: str) -> None:
        """End every console session of a user, on every replica (sign-out)."""
        async with self.database.transaction() as session:
            await session.execute(
                update(UserRow)
                .where(UserRow.id == user_id)
                .values(session_version=UserRow.session_version + 1)
            )

    async def check_password(self, email: str, password: str) -> User:
        """The user with this email and password (disabled or not), else WrongCredentials.

        An unknown email, a user without a password and a wrong password cost the same hash
        and give the same answer, so that sign-in tells nobody which emails have accounts.
        """
        async with self.database.transaction() as session:
            row = await session.scalar(
                select(UserRow).where(UserRow.email == email.strip().lower())
            )
        matched = await passwords.verify(None if row is None else row.password_hash, password)
        if row is None or not matched:
            raise WrongCredentials("The email or the password is not right.")
        if row.password_hash is not None and passwords.needs_rehash(row.password_hash):
            await self.set_password(row.id, password, end_sessions=False)
        return user_of(row)

    # Keys
