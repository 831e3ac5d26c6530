"""Users' passwords (``gateway/operator/passwords.py``): an argon2id hash of the stated
parameters, never the password; a check of an unknown user's password costs a check all the
same and fails; a hash of other parameters verifies and asks to be remade."""

from __future__ import annotations

import asyncio

import pytest
from argon2 import PasswordHasher, Type

from gateway.errors import InvalidRequestError
from gateway.operator import passwords

SECRET = "correct horse battery staple"


async def test_a_hash_is_argon2id_of_the_stated_parameters_and_verifies() -> None:
    stored = await passwords.hash_password(SECRET)
    assert stored.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert SECRET not in stored
    assert stored != await passwords.hash_password(SECRET)  # a salt of its own each time
    assert await passwords.verify_password(stored, SECRET)
    assert not await passwords.verify_password(stored, SECRET + "!")
    assert not await passwords.verify_password("not a hash", SECRET)
    assert not passwords.needs_rehash(stored)


async def test_an_unknown_user_is_checked_against_a_hash_all_the_same() -> None:
    assert not await passwords.verify_password(None, SECRET)
    assert not await passwords.verify_password(None, "")
    assert passwords._DUMMY and passwords._DUMMY[0].startswith("$argon2id$")


async def test_a_hash_of_older_parameters_verifies_and_is_to_be_remade() -> None:
    older = PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1, type=Type.ID)
    stored = older.hash(SECRET)
    assert await passwords.verify_password(stored, SECRET)
    assert passwords.needs_rehash(stored)


async def test_hashing_runs_beside_the_event_loop() -> None:
    """Several hashes at once (more than the gate lets through) while the loop keeps
    ticking: the hashing is in worker threads."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    ticker = asyncio.create_task(tick())
    made = await asyncio.gather(*(passwords.hash_password(SECRET) for _ in range(6)))
    ticker.cancel()
    assert len(set(made)) == 6 and ticks >= 5


@pytest.mark.parametrize("value", [None, 12345678, "short", "x" * 257])
def test_a_password_out_of_bounds_is_named(value: object) -> None:
    with pytest.raises(InvalidRequestError) as err:
        passwords.checked(value, "new")
    assert err.value.message.startswith("new: must be a string of 8 to 256 characters")
