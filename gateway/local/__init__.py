"""Client endpoints the gateway answers itself, without an upstream: the model lists and
the one-api billing dashboard."""
