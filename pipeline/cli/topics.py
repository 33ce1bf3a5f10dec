"""``python -m pipeline topics``: list, describe, create, delete topics and alter their
configs, on the admin client (:class:`pipeline.Admin`)::

    pipeline topics list [-J] [--internal]
    pipeline topics describe TOPIC... [-J]
    pipeline topics create TOPIC... [-p PARTITIONS] [-r REPLICATION] [--set K=V]... [--if-not-exists]
    pipeline topics delete TOPIC... [--if-exists]
    pipeline topics alter-config TOPIC [--set K=V]... [--delete K]... [--validate-only]

Every action takes ``-b``, ``-X``, ``--config FILE`` and ``--timeout`` as ``consume``
does. A refused action is one ``error:`` line with the broker's reason (exit status 1);
``create --if-not-exists`` and ``delete --if-exists`` make the obvious cases succeed.
``describe`` lists the configs set on the topic itself (as ``kafka-topics.sh --describe``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from pipeline.cli._common import (
    UserError,
    add_bootstrap,
    add_client_options,
    cluster_options,
    resolve_bootstrap,
    run_guarded,
    setup_logging,
)

HELP = "list, describe, create and delete topics, alter topic configs (admin client)"

Action = Callable[[Any, argparse.Namespace], Coroutine[Any, Any, None]]


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str, run: Action) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_parser=sub, _action=run)
        add_bootstrap(sub)
        add_client_options(sub, what="client")
        return sub

    listing = action("list", "list the topics' names (-J: a JSON list)", _list)
    listing.add_argument("-J", "--json", action="store_true", help="a JSON list")
    listing.add_argument("--internal", action="store_true",
                         help="include internal topics (__consumer_offsets...)")

    describe = action("describe", "partitions, leaders, replicas and the topic's own configs",
                      _describe)
    describe.add_argument("topics", nargs="+", metavar="TOPIC")
    describe.add_argument("-J", "--json", action="store_true", help="one JSON object per topic")

    create = action("create", "create topics", _create)
    create.add_argument("topics", nargs="+", metavar="TOPIC")
    create.add_argument("-p", "--partitions", type=_positive, default=None,
                        help="partitions (default: the broker's num.partitions)")
    create.add_argument("-r", "--replication-factor", type=_positive, default=None,
                        help="replicas (default: the broker's default.replication.factor)")
    create.add_argument("--set", dest="settings", metavar="KEY=VALUE", type=_setting,
                        action="append", default=[], help="a topic config (repeatable)")
    create.add_argument("--if-not-exists", action="store_true",
                        help="a topic that exists already is not an error")

    delete = action("delete", "delete topics", _delete)
    delete.add_argument("topics", nargs="+", metavar="TOPIC")
    delete.add_argument("--if-exists", action="store_true",
                        help="a topic that does not exist is not an error")

    alter = action("alter-config", "set or delete topic configs (incrementally)", _alter)
    alter.add_argument("topic", metavar="TOPIC")
    alter.add_argument("--set", dest="settings", metavar="KEY=VALUE", type=_setting,
                       action="append", default=[], help="set this config (repeatable)")
    alter.add_argument("--delete", dest="deletions", metavar="KEY", action="append",
                       default=[], help="back to the default (repeatable)")
    alter.add_argument("--validate-only", action="store_true",
                       help="ask the broker whether it would accept, change nothing")


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import trio

    setup_logging(args.verbose)
    resolve_bootstrap(args)
    options = cluster_options(args)
    trio.run(_with_admin, args, options)
    return 0


async def _with_admin(args: argparse.Namespace, options: dict[str, Any]) -> None:
    from pipeline.cluster.admin import Admin

    async with Admin.open(args.bootstrap, timeout=args.timeout, **options) as admin:
        await args._action(admin, args)


async def _list(admin: Any, args: argparse.Namespace) -> None:
    topics = await admin.describe_topics()
    names = sorted(n for n, t in topics.items() if args.internal or not t.internal)
    if args.json:
        print(json.dumps(names))
    for name in [] if args.json else names:
        print(name)


async def _describe(admin: Any, args: argparse.Namespace) -> None:
    from pipeline.cluster.admin_types import ConfigSource
    from pipeline.protocol.errors import ErrorCode

    topics = await admin.describe_topics(args.topics)
    missing = [n for n in args.topics if topics.get(n) is None
               or topics[n].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    if missing:
        raise UserError(f"unknown topic {missing[0]!r}")
    for name in dict.fromkeys(args.topics):
        t = topics[name]
        configs = await admin.describe_topic_config(name)
        changed = {k: e.value for k, e in sorted(configs.items())
                   if e.source == ConfigSource.TOPIC}
        replication = len(t.partitions[0].replicas) if t.partitions else 0
        if args.json:
            print(json.dumps({
                "topic": name,
                "id": str(t.topic_id) if t.topic_id is not None else None,
                "internal": t.internal,
                "partitions": [{"partition": p.partition, "leader": p.leader,
                                "replicas": list(p.replicas), "isr": list(p.isr)}
                               for p in t.partitions],
                "configs": changed,
            }))
            continue
        print(f"topic {name}: {len(t.partitions)} partitions, replication factor "
              f"{replication}" + (f", id {t.topic_id}" if t.topic_id is not None else ""))
        for p in t.partitions:
            print(f"  partition {p.partition}: leader {p.leader}, replicas "
                  f"{','.join(map(str, p.replicas))}, isr {','.join(map(str, p.isr))}")
        for key, value in changed.items():
            print(f"  config {key}={value if value is not None else '(sensitive)'}")


async def _create(admin: Any, args: argparse.Namespace) -> None:
    from pipeline.cluster.admin_types import NewTopic
    from pipeline.protocol.errors import ErrorCode

    names = list(dict.fromkeys(args.topics))
    topics = [NewTopic(name, args.partitions or -1, args.replication_factor or -1,
                       dict(args.settings)) for name in names]
    results = await admin.create_topics(topics)
    for name in names:
        error = results[name]
        if error is None:
            print(f"created topic {name}", file=sys.stderr)
        elif error.code == ErrorCode.TOPIC_ALREADY_EXISTS and args.if_not_exists:
            print(f"topic {name} exists already", file=sys.stderr)
        elif error.code == ErrorCode.TOPIC_ALREADY_EXISTS:
            raise UserError(f"topic {name!r} exists already (--if-not-exists: not an error)")
        else:
            raise error


async def _delete(admin: Any, args: argparse.Namespace) -> None:
    from pipeline.protocol.errors import ErrorCode

    names = list(dict.fromkeys(args.topics))
    results = await admin.delete_topics(names)
    for name in names:
        error = results[name]
        if error is None:
            print(f"deleted topic {name}", file=sys.stderr)
        elif error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and args.if_exists:
            print(f"topic {name} does not exist", file=sys.stderr)
        elif error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise UserError(f"unknown topic {name!r} (--if-exists: not an error)")
        else:
            raise error


async def _alter(admin: Any, args: argparse.Namespace) -> None:
    if not args.settings and not args.deletions:
        raise UserError("nothing to change: give --set KEY=VALUE and/or --delete KEY")
    await admin.alter_topic_config(args.topic, dict(args.settings), args.deletions,
                                   validate_only=args.validate_only)
    verb = "would be accepted" if args.validate_only else "altered"
    print(f"configs of topic {args.topic} {verb}", file=sys.stderr)
