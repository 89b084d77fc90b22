"""`tide mine`: corpus -> ranked candidate terms (owned by the mining work, issue 4)."""


def register(sub) -> None:
    parser = sub.add_parser("mine", help="choose new terms from a domain corpus")
    parser.add_argument("--corpus", required=True)
    parser.set_defaults(handler=_run)


def _run(args) -> int:
    from extension.errors import TideError

    raise TideError("tide mine is not available yet in this build", param="command")
