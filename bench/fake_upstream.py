"""The bundled fake upstream: OpenAI, Anthropic, Gemini, AWS Bedrock, Google Vertex AI and
Azure OpenAI wire formats on one port.

    python -m bench.fake_upstream [--host 127.0.0.1] [--port 9001] [--require-key K]
                                  [--chunks N] [--first-ms X] [--delay-ms Y]
                                  [--service-account FILE] [--no-prompt-cache]

Serves the demo channels of ``make run`` (openai at ``/v1``, anthropic, gemini and bedrock at
the root; bedrock requests must be signed with SigV4 by ``bench.fake.aws_auth``'s test key,
azure ones carry ``bench.fake.azure``'s key; vertex ones a token of its ``/token`` endpoint,
which knows the service account whose key file ``--service-account`` writes: a vertex
channel's ``credentials``) and the benchmarks' paced streams. Its usage reports the providers'
prompt caches (``bench.fake.prompt_cache``) unless ``--no-prompt-cache``. In tests: ``async with
FakeUpstream() as fake`` (see ``bench.fake``). Prints one line once listening; nothing per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from bench.fake import Defaults, FakeUpstream, RecordedRequest, Reply

__all__ = ["Defaults", "FakeUpstream", "RecordedRequest", "Reply", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.fake_upstream", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001, help="0 picks a free port")
    parser.add_argument("--require-key", default=None, help="accept only this API key")
    parser.add_argument("--chunks", type=int, default=None, help="stream pieces per reply")
    parser.add_argument("--first-ms", type=float, default=0.0, help="wait before answering")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="wait between stream pieces")
    parser.add_argument(
        "--service-account",
        default=None,
        metavar="FILE",
        help="write the key file of a service account the token endpoint knows (vertex)",
    )
    parser.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="report no prompt-cache reads or writes (every prompt fresh)",
    )
    return parser


async def _serve(args: argparse.Namespace) -> None:
    defaults = Defaults(chunks=args.chunks, first_ms=args.first_ms, delay_ms=args.delay_ms)
    fake = FakeUpstream(
        args.host,
        args.port,
        require_key=args.require_key,
        defaults=defaults,
        record=False,
        prompt_cache=not args.no_prompt_cache,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with fake:
        if args.service_account:
            with open(args.service_account, "w") as out:
                json.dump(fake.service_account(), out)
        print(f"fake upstream listening on {fake.url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(_parser().parse_args(argv)))


if __name__ == "__main__":
    main()
