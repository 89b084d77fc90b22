"""`tide serve`, `tide worker`, `tide keys` (the service's processes and its API keys)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 in a container)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=_serve)

    worker = sub.add_parser("worker", help="run a job worker (one per GPU)")
    worker.add_argument("--hostname", default=None, help="worker name (default: celery's host name)")
    worker.add_argument("--loglevel", default="info", choices=["critical", "error", "warning", "info", "debug"])
    worker.set_defaults(handler=_worker)

    keys = sub.add_parser("keys", help="create, revoke and list API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it (shown only this once)")
    create.add_argument("name", help="who or what the key is for")
    create.set_defaults(handler=_keys_create)
    revoke = keys_sub.add_parser("revoke", help="revoke keys by id, shown prefix, whole key, or name (all keys of that name)")
    revoke.add_argument("selector")
    revoke.set_defaults(handler=_keys_revoke)
    listing = keys_sub.add_parser("list", help="list keys (never their secret)")
    listing.set_defaults(handler=_keys_list)


def _serve(args) -> int:
    import uvicorn

    uvicorn.run("app.main:create_app", factory=True, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _worker(args) -> int:
    from app.settings import get_settings
    from worker.celery_app import celery_app

    settings = get_settings()
    argv = ["worker", f"--loglevel={args.loglevel}", f"--queues={settings.queue}", "--pool=prefork", "--concurrency=1", "--max-tasks-per-child=1"]
    if args.hostname:
        argv.append(f"--hostname={args.hostname}")
    celery_app.worker_main(argv)
    return 0


def _sessions():
    from app.db.engine import init_db, make_engine, make_sessionmaker
    from app.settings import get_settings

    engine = make_engine(get_settings().resolved_database_url)
    init_db(engine)
    return make_sessionmaker(engine)


def _keys_create(args) -> int:
    from extension.errors import TideError

    from app.db.keys import create_key

    name = args.name.strip()
    if not name or len(name) > 200:
        raise TideError("the key name must be 1 to 200 characters", param="name")
    with _sessions()() as session:
        key, plaintext = create_key(session, name)
    print(plaintext)
    print(f"created key {key.id} ({key.prefix}…) for {name!r}; it is shown only once — store it now", file=sys.stderr)
    return 0


def _keys_revoke(args) -> int:
    from extension.errors import TideError

    from app.db.keys import find_keys, revoke

    with _sessions()() as session:
        keys = find_keys(session, args.selector)
        if not keys:
            raise TideError(f"no active key matches {args.selector!r}; `tide keys list` shows ids, prefixes and names", param="selector")
        revoke(session, keys)
        for key in keys:
            print(f"revoked key {key.id} ({key.prefix}…) {key.name!r}")
    return 0


def _keys_list(args) -> int:
    from app.db.keys import list_keys

    with _sessions()() as session:
        keys = list_keys(session)
    print(f"{'id':>4}  {'prefix':<14} {'created (UTC)':<20} {'status':<8} name")
    for key in keys:
        status = "revoked" if key.revoked_at else "active"
        print(f"{key.id:>4}  {key.prefix + '…':<14} {key.created_at:%Y-%m-%d %H:%M:%S}  {status:<8} {key.name}")
    return 0
