"""The upstream side: the aiohttp pool, the one place aiohttp errors become gateway errors."""
