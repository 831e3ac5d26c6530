"""`python -m gateway` is the same as the `gateway` command."""

from gateway.cli import main

raise SystemExit(main())
