"""Who is calling (keys), where a request goes (routing, channel health) and what it
costs (rates, token estimates)."""
