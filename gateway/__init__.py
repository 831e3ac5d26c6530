"""Model gateway: one relay in front of every AI model provider."""

__version__ = "0.1.0"
