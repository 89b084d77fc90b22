"""HTTP routes, thin: parse, check ownership, call app.submission / app.db, shape the answer."""

from ..schemas import ErrorResponse

_ERROR = {"model": ErrorResponse}

# Answers any authenticated route can give, documented so clients (and schema checkers) know them.
AUTH_ERRORS = {401: {**_ERROR, "description": "Missing, invalid or revoked API key"}}
NOT_FOUND = {404: {**_ERROR, "description": "No such job for this API key"}}
INVALID = {422: {**_ERROR, "description": "Invalid input; `param` names the field"}}
CONFLICT = {409: {**_ERROR, "description": "The job is not in a state that allows this"}}
GONE = {410: {**_ERROR, "description": "The artifacts have expired or were deleted"}}
TOO_MANY_JOBS = {429: {**_ERROR, "description": "This key has TIDE_MAX_ACTIVE_JOBS_PER_KEY jobs queued or running"}}
STORAGE_FULL = {507: {**_ERROR, "description": "This key keeps TIDE_MAX_STORED_BYTES_PER_KEY of models and uploads"}}
