"""`tide jobs ...`: submit, list, show, wait, events, cancel, delete and download jobs of a TIDE
server, and list or delete its stored corpora, through app.client (HTTP only, like any outside user).

The server URL and key come from --url / --api-key or TIDE_URL / TIDE_API_KEY (prefer the
variable for the key: a flag shows up in the process list)."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--url", help="server URL (default: $TIDE_URL)")
    server.add_argument("--api-key", help="API key (default: $TIDE_API_KEY; prefer it, a flag shows in the process list)")
    jobs = sub.add_parser("jobs", help="use a TIDE server: submit, wait for, and download jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)

    def add(name: str, **kwargs):
        return jobs_sub.add_parser(name, parents=[server], **kwargs)

    submit = add("submit", help="start a job (terms, a corpus, or both)")
    submit.add_argument("--base-model", required=True, help="a model the server offers (see `tide jobs models`)")
    submit.add_argument("--terms", metavar="FILE", help="terms file: UTF-8, one term per line")
    submit.add_argument("--term", action="append", default=[], metavar="TERM", help="one term (repeat the flag for more)")
    submit.add_argument("--examples", metavar="FILE", help="with terms and no corpus: a few documents of your own text "
                        "(blank-line separated, or .jsonl) the job trains the terms on first and judges the model on")
    submit.add_argument("--corpus", metavar="FILE", help="corpus to upload: UTF-8 text (documents between blank lines) or .jsonl")
    submit.add_argument("--text-field", help="JSONL corpora: the field holding the text")
    submit.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", dest="settings",
        help="a request option by its API name, e.g. --set training.steps=50 --set mining.max_new_tokens=200 "
        "(values are read as JSON, else as text; the server checks them)",
    )
    submit.add_argument("--idempotency-key", help="retrying with the same key returns the same job")
    submit.add_argument("--wait", action="store_true", help="then wait for it with a progress bar")
    submit.set_defaults(handler=_submit)

    listing = add("list", help="your jobs, newest first")
    listing.add_argument("--status", choices=["queued", "running", "cancelling", "succeeded", "failed", "cancelled"])
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(handler=_list)

    models = add("models", help="base models the server offers")
    models.set_defaults(handler=_models)

    for name, handler, text in (
        ("show", _show, "a job as JSON"),
        ("wait", _wait, "wait for a job with a progress bar; exit 0 only if it succeeded"),
        ("cancel", _cancel, "cancel a queued or running job"),
        ("delete", _delete, "delete a finished job and its files"),
    ):
        command = add(name, help=text)
        command.add_argument("job_id")
        if name == "wait":
            command.add_argument("--timeout", type=float, help="give up after this many seconds")
        command.set_defaults(handler=handler)

    files = add("files", help="your stored corpora (uploads and inline corpus_text): size, age, the jobs that use them")
    files.set_defaults(handler=_files)
    delete_file = add("delete-file", help="delete a stored corpus; its bytes leave your storage quota")
    delete_file.add_argument("file_id")
    delete_file.set_defaults(handler=_delete_file)

    events = add("events", help="a job's events, one JSON object a line")
    events.add_argument("job_id")
    events.add_argument("--after", type=int, default=0, help="only events after this id")
    events.add_argument("--follow", action="store_true", help="keep printing until the job has finished")
    events.set_defaults(handler=_events)

    download = add("download", help="download the model (resumes; sha256 checked) and unpack it")
    download.add_argument("job_id")
    download.add_argument("--out", default=".", help="folder for the archive and the unpacked model (default: here)")
    download.add_argument("--no-extract", action="store_true", help="keep the .tar, do not unpack it")
    download.set_defaults(handler=_download)


def _option_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _options(settings: list[str]) -> dict:
    from .client import ClientError

    options: dict = {}
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ClientError("invalid_option", f"--set {item!r}: write NAME=VALUE, e.g. --set training.steps=50", "--set")
        node = options
        parts = name.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ClientError("invalid_option", f"--set {item!r}: {part} was already given a value", "--set")
        node[parts[-1]] = _option_value(value)
    return options


def _run(args, action) -> int:
    """Open a client, run the action, print client errors the way the rest of `tide` does."""
    from .client import ClientError, TideClient

    try:
        with TideClient(args.url, args.api_key) as client:
            return action(client) or 0
    except ClientError as exc:
        where = f" ({exc.param})" if exc.param else ""
        print(f"tide: error{where}: {exc.message}", file=sys.stderr)
        return 2


def _print_json(value) -> None:
    print(json.dumps(value, indent=2, default=str))


def _finished(job: dict) -> int:
    if job["status"] == "succeeded":
        print(f"{job['id']} succeeded", file=sys.stderr)
        return 0
    error = job.get("error") or {}
    detail = f": {error.get('code')}: {error.get('message')}" if error else ""
    print(f"{job['id']} {job['status']}{detail}", file=sys.stderr)
    return 1


def _submit(args) -> int:
    from .client import read_examples_file, read_terms_file

    def action(client):
        terms = list(args.term)
        if args.terms:
            terms += read_terms_file(args.terms)
        examples = read_examples_file(args.examples, args.text_field or "text") if args.examples else None
        job = client.submit(
            args.base_model, terms=terms or None, examples=examples, corpus=args.corpus, text_field=args.text_field,
            options=_options(args.settings), idempotency_key=args.idempotency_key,
        )
        print(job["id"])
        if args.wait:
            return _finished(client.wait(job["id"]))
        return 0

    return _run(args, action)


def _list(args) -> int:
    def action(client):
        print(f"{'id':<37} {'status':<11} {'stage':<9} {'progress':>9}  {'created (UTC)':<19}  base model")
        for job in client.jobs(args.status, args.limit):
            progress = f"{job['progress']['step']}/{job['progress']['total']}"
            print(f"{job['id']:<37} {job['status']:<11} {job['stage'] or '-':<9} {progress:>9}  {job['created_at'][:19].replace('T', ' '):<19}  {job['base_model']}")

    return _run(args, action)


def _models(args) -> int:
    def action(client):
        for model in client.models():
            print(f"{model['name']:<24} {model['kind']:<11} {model.get('description') or ''}")

    return _run(args, action)


def _show(args) -> int:
    return _run(args, lambda client: _print_json(client.job(args.job_id)))


def _wait(args) -> int:
    return _run(args, lambda client: _finished(client.wait(args.job_id, timeout=args.timeout)))


def _cancel(args) -> int:
    def action(client):
        job = client.cancel(args.job_id)
        print(f"{job['id']} {job['status']}")

    return _run(args, action)


def _delete(args) -> int:
    def action(client):
        client.delete(args.job_id)
        print(f"{args.job_id} deleted")

    return _run(args, action)


def _files(args) -> int:
    def action(client):
        print(f"{'id':<37} {'bytes':>13}  {'created (UTC)':<19}  {'jobs':<45}  name")
        for stored in client.files():
            jobs = ", ".join(f"{job['id']} ({job['status']})" for job in stored["jobs"]) or "-"
            print(f"{stored['id']:<37} {stored['bytes']:>13,}  {stored['created_at'][:19].replace('T', ' '):<19}  {jobs:<45}  {stored['filename']}")

    return _run(args, action)


def _delete_file(args) -> int:
    def action(client):
        client.delete_file(args.file_id)
        print(f"{args.file_id} deleted")

    return _run(args, action)


def _events(args) -> int:
    def action(client):
        if args.follow:
            events = client.follow_events(args.job_id, args.after)
        else:
            events = client.events(args.job_id, args.after, limit=1000)[0]
        for event in events:
            print(json.dumps(event), flush=True)

    return _run(args, action)


def _download(args) -> int:
    def action(client):
        result = client.download(args.job_id, args.out, extract=not args.no_extract)
        if result.resumed_from:
            print(f"resumed at byte {result.resumed_from:,} of {result.size:,}", file=sys.stderr)
        print(f"sha256 {result.sha256} matches the manifest", file=sys.stderr)
        print(result.folder or result.archive)

    return _run(args, action)
