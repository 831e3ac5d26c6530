"""How much one request may be billed, against an upstream that reports more than it could
have used (pure: the account's side comes in through a callback).

A request holds its expected cost while it runs (``relay.pipeline.Relay._hold``), and trusts
the upstream's count when it ends: a request in flight may take its balance below zero by
its own cost (CONTRACT §4). An upstream that over-reports (a broken one, or one that lies)
made that unbounded: 100x the asked tokens took a balance of 0.01 to -1.04, and a key quota
of 0.01 to 2.10 spent. Two bounds:

- **The request's own maximum.** A request that sets its maximum output (``max_tokens`` and
  its kin, times the choices it asks for: ``kinds.chat``) is never billed more output than
  that: no upstream generates past it, so a count above it is not believed. Its prompt is
  billed as reported.
- **What the account can pay, for a stream.** A stream's output is metered as it passes
  (``Meter``: the tokens its text makes, or the upstream's own count where it sends one as
  it goes). It may produce what its hold covers, and no more than its account could spend
  when it was admitted (its balance less what the other requests in flight held, its key's
  quota likewise); past that it asks for more (``extend``): its hold grows by what the
  account still has unheld, as an admission would check it, so streams running at once draw
  on one balance and never on the same money twice. When nothing is left, the stream is cut
  with a 402 inside it, in the client's protocol, and billed the output it was covered for.
  So an account goes below zero by at most its streams' prompts. Every amount here is at the
  key's group's price ratio (``ratio``), as its bill will be.

A whole reply that sets no maximum is billed as reported: its output was generated before
anything could be cut, and billing an honest reply less than it cost would make every reply
that outgrows a small balance partly free (the contract lets a request overdraw by its own
cost).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from gateway.errors import InsufficientBalanceError
from gateway.policy.billing import PICO_PER_MICRO, Metered, Rate, usage_tokens
from gateway.protocols.base import RelayStream
from gateway.types import Usage

CUT_MESSAGE = (
    "The account's balance (or this key's quota) cannot pay for more of this reply; "
    "the stream was stopped. Top it up to continue."
)


def tokens_for(micro: int, rate: Rate, ratio: Fraction | int = 1) -> int:
    """The output tokens ``micro`` micro-units pay for at the group's ``ratio`` (0 for nothing
    or less)."""
    return int(max(micro, 0) * PICO_PER_MICRO // (rate.output * ratio))


def micro_for(tokens: int, rate: Rate, ratio: Fraction | int = 1) -> int:
    """What ``tokens`` output tokens cost at the group's ``ratio``, in micro-units rounded up
    (what a hold takes)."""
    return int(-(-tokens * rate.output * ratio // PICO_PER_MICRO))


def allowance(
    spendable: int,
    expected: int,
    rate: Rate | None,
    ceiling: int | None,
    ratio: Fraction | int = 1,
) -> int | None:
    """The output tokens a stream may produce before it asks for more: what its hold covers
    (``expected``), no more than ``spendable`` micro-units pay for after the call's own price,
    every price times the group's ``ratio``. None when it needs no meter: not charged, output
    free, or its own maximum output (``ceiling``) costs no more than it can spend."""
    if rate is None or rate.output <= 0:
        return None
    budget = int(max(spendable * PICO_PER_MICRO - rate.request * ratio, 0) // (rate.output * ratio))
    if ceiling is not None and ceiling <= budget:
        return None
    return min(expected, budget)


class Meter:
    """One stream's output against what it may produce (``tokens``), looked at after each
    upstream read: the stream's count of what passed (``generated``) and the upstream's own
    count, read again only when its usage changed (an identity check per read). Past
    ``tokens`` it calls ``extend(needed, tokens)`` for more, which returns the tokens granted
    (0: none left; the stream is over). Never past ``ceiling``, the request's own maximum:
    a count above that is not believed, and billed as that (``kinds.chat``)."""

    __slots__ = ("tokens", "ceiling", "_extend", "_seen", "_reported")

    def __init__(
        self, tokens: int, extend: Callable[[int, int], int], ceiling: int | None = None
    ) -> None:
        self.tokens = tokens
        self.ceiling = ceiling
        self._extend = extend
        self._seen: Usage | None = None
        self._reported = 0

    def over(self, stream: RelayStream) -> bool:
        usage = stream.usage
        if usage is not self._seen:
            self._seen = usage
            self._reported = usage_tokens(usage)[1]
        used = max(stream.generated, self._reported)
        if used <= self.tokens:
            return False
        ceiling = self.ceiling
        if ceiling is not None:
            if self.tokens >= ceiling:
                return False  # all it asked for is covered: more is not believed
            used = min(used, ceiling)
        granted = self._extend(used - self.tokens, self.tokens)
        if granted <= 0:
            return True
        self.tokens += granted
        return used > self.tokens

    def bound(self, used: Metered) -> Metered:
        """What a metered stream is billed: at most the output it was covered for."""
        if used.completion_tokens > self.tokens:
            used.completion_tokens = self.tokens
            used.classified()
        return used

    @staticmethod
    def exceeded() -> InsufficientBalanceError:
        return InsufficientBalanceError(CUT_MESSAGE)
