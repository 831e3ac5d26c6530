"""The relay: the request pipeline (``pipeline``), one upstream attempt (``attempt``), the
stream loop (``stream``) and the usage record as it fills in (``call``)."""

from gateway.relay.pipeline import Relay

__all__ = ["Relay"]
