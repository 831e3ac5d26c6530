"""Users' passwords: kept only as an argon2id hash (argon2-cffi), never the password.

The parameters are OWASP's first recommendation for argon2id (Password Storage Cheat Sheet):
**memory 19 MiB (19,456 KiB), 2 iterations, 1 lane**, a random 16-byte salt per hash and a
32-byte hash, in the PHC string format (``$argon2id$v=19$m=19456,t=2,p=1$salt$hash``), so a
hash records its own parameters. One hash or check takes about 50-100 ms on one core.

- A hash made with other parameters still verifies; the sign-in that verifies it stores a new
  hash with these (``needs_rehash``), so changing the parameters here upgrades every user as
  it signs in.
- Hashing runs in a worker thread (argon2-cffi releases the GIL), so the event loop keeps
  serving; at most ``CONCURRENT_HASHES`` run at once per process, so a burst of sign-ins
  costs at most that many times 19 MiB.
- A sign-in for a username that does not exist verifies the password against a hash of a
  random one all the same, so it takes as long as one that does: the time of a refusal does
  not tell which usernames exist.
"""

from __future__ import annotations

import asyncio
import secrets
import weakref

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from gateway.errors import InvalidRequestError

TIME_COST = 2
MEMORY_COST_KIB = 19_456
PARALLELISM = 1
HASH_LEN = 32
SALT_LEN = 16
CONCURRENT_HASHES = 4
MIN_LENGTH = 8
MAX_LENGTH = 256  # characters; longer is refused before any hashing

HASHER = PasswordHasher(
    time_cost=TIME_COST,
    memory_cost=MEMORY_COST_KIB,
    parallelism=PARALLELISM,
    hash_len=HASH_LEN,
    salt_len=SALT_LEN,
    type=Type.ID,
)
_DUMMY: list[str] = []  # the hash an unknown username's password is checked against
# one gate per event loop (a semaphore belongs to the loop it first waited on)
_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    gate = _GATES.get(loop)
    if gate is None:
        gate = _GATES[loop] = asyncio.Semaphore(CONCURRENT_HASHES)
    return gate


def checked(value: object, field: str = "password") -> str:
    """A password as given: a string of ``MIN_LENGTH`` to ``MAX_LENGTH`` characters (400
    naming the field otherwise)."""
    if not isinstance(value, str) or not MIN_LENGTH <= len(value) <= MAX_LENGTH:
        raise InvalidRequestError(
            f"{field}: must be a string of {MIN_LENGTH} to {MAX_LENGTH} characters"
        )
    return value


async def hash_password(password: str) -> str:
    async with _slots():
        return await asyncio.to_thread(HASHER.hash, password)


def _verify(stored: str, password: str) -> bool:
    try:
        return HASHER.verify(stored, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def verify_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from; with no hash (no such
    user), a check of equal cost that fails."""
    if stored is None:
        if not _DUMMY:
            _DUMMY.append(await hash_password(secrets.token_urlsafe(16)))
        stored = _DUMMY[0]
        password = "\0" + password  # never the dummy's own password
    async with _slots():
        return await asyncio.to_thread(_verify, stored, password)


def needs_rehash(stored: str) -> bool:
    """Whether a hash was made with other parameters than these."""
    try:
        return HASHER.check_needs_rehash(stored)
    except InvalidHashError:
        return True
