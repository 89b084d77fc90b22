"""`tide extend`: the main job, from the terminal."""


def register(sub) -> None:
    parser = sub.add_parser("extend", help="extend a model's tokenizer with new terms and train the new rows")
    parser.set_defaults(handler=_run)


def _run(args) -> int:
    from extension.errors import TideError

    raise TideError("extend is being wired up", param="command")
