"""The `herald` command (`python -m herald_client` too): `herald listen --forward-to URL`."""
from __future__ import annotations

import argparse
import os
import sys

from herald_client.listen import WAIT_SECONDS, Listener, Options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="herald", description="Tools for developers receiving Herald's webhooks.")
    commands = parser.add_subparsers(dest="command", required=True)
    listen = commands.add_parser(
        "listen", help="forward a tenant's webhooks to a local URL (no public address needed)",
        description="Make a polling endpoint (or use --endpoint), long-poll its messages and POST each to "
                    "--forward-to with the signed Standard Webhooks headers as they are. Ctrl-C deletes the "
                    "endpoint it made.")
    listen.add_argument("--forward-to", required=True, metavar="URL",
                        help="where each message is POSTed, e.g. http://localhost:4242/webhooks")
    listen.add_argument("--api", default=os.environ.get("HERALD_URL") or "http://127.0.0.1:8000",
                        help="Herald's URL (default: $HERALD_URL or http://127.0.0.1:8000)")
    listen.add_argument("--token", default=os.environ.get("HERALD_TOKEN"),
                        help="a tenant credential, or a platform one with --tenant (default: $HERALD_TOKEN)")
    listen.add_argument("--tenant", help="with a platform credential: the tenant (tnt_… or its uid) to listen for")
    listen.add_argument("--events", action="append", metavar="TYPES",
                        help="event types or patterns to receive, comma-separated (repeatable; default: all)")
    listen.add_argument("--endpoint", metavar="ID", help="use this poll endpoint instead of making one")
    listen.add_argument("--wait", type=float, default=WAIT_SECONDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a token is needed: --token or $HERALD_TOKEN")
    events = [name.strip() for value in args.events or [] for name in value.split(",") if name.strip()]
    options = Options(forward_to=args.forward_to, api=args.api, token=args.token, tenant=args.tenant,
                      events=events or None, endpoint=args.endpoint, wait=args.wait)
    return Listener(options).run()


if __name__ == "__main__":
    sys.exit(main())
