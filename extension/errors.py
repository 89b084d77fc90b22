"""Errors a user can act on. Every message names what was wrong and how to fix it."""


class TideError(Exception):
    """Base class: `code` is a stable machine-readable name, `param` the input at fault."""

    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code:
            self.code = code


class ModelNotFoundError(TideError):
    code = "model_not_found"


class InvalidTermsError(TideError):
    code = "invalid_terms"


class InvalidCorpusError(TideError):
    code = "invalid_corpus"


class InvalidOptionError(TideError):
    """A job option out of its range. Raised with `option` (its name in extension.plan.options) and
    `problem` ("must be ..., got ..."), so the CLI can name the flag and the API the JSON path;
    a plain `message` is for option-like inputs outside the option table (terms, corpus)."""

    code = "invalid_option"

    def __init__(self, message: str | None = None, *, option: str | None = None, problem: str | None = None,
                 param: str | None = None, code: str | None = None):
        self.option, self.problem = option, problem
        super().__init__(message or f"{option} {problem}", param=param or option, code=code)


class UnsupportedTokenizerError(TideError):
    """The base model's tokenizer is of a kind or layout TIDE cannot extend without moving old ids."""

    code = "unsupported_tokenizer"

    def __init__(self, message: str, *, param: str | None = "base_model", code: str | None = None):
        super().__init__(message, param=param, code=code)


class OutputExistsError(TideError):
    code = "output_exists"


class JobCancelled(Exception):
    """Raised inside the pipeline when the cancel check says stop; not an error."""


class UnsupportedCheckpointError(TideError):
    """The base model is a training checkpoint whose optimizer state cannot be carried over."""

    code = "unsupported_checkpoint"

    def __init__(self, message: str, *, param: str | None = "base_model", code: str | None = None):
        super().__init__(message, param=param, code=code)


class UnsupportedModelError(TideError):
    """The base model's architecture does something TIDE cannot reproduce (its head, its embedding
    layout) or its class cannot be loaded; the message names what and what to do instead."""

    code = "unsupported_model"

    def __init__(self, message: str, *, param: str | None = "base_model", code: str | None = None):
        super().__init__(message, param=param, code=code)
