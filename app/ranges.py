"""Range answers that keep the API's rules, for every download.

Starlette's FileResponse answers a Range it cannot parse with a plain-text 400, reads some
malformed ones as numbers (`bytes=--5` as "the last -5 bytes", then a 416), and answers a Range
past the end of the file with an empty 416. RFC 9110 (section 14.2) lets a server ignore a
Range header it cannot use, so one that is not `bytes=` followed by a list of `first-[last]` or
`-suffix` gets the whole file (200), as if it were absent; a Range that starts past the end is
a 416 in the one error shape, with the Content-Range that tells a client the file's size.
`RangeRules` goes first in the bases of any FileResponse subclass that serves downloads.
"""

from __future__ import annotations

import re

from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable

from .errors import ApiError

_UNIT = re.compile(r"\s*bytes\s*=(.*)", re.IGNORECASE | re.DOTALL)
_RANGE_SPEC = re.compile(r"[0-9]+-[0-9]*|-[0-9]+")  # RFC 9110 section 14.1.1: int-range or suffix-range


def well_formed(http_range: str) -> bool:
    """True when the header follows RFC 9110's `bytes=` grammar (empty list elements allowed)."""
    unit = _UNIT.fullmatch(http_range)
    if unit is None:
        return False
    specs = [part.strip() for part in unit.group(1).split(",")]
    return any(specs) and all(_RANGE_SPEC.fullmatch(spec) for spec in specs if spec)


class RangeRules:
    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        if not well_formed(http_range):
            return []  # FileResponse sends the whole file for an empty list of ranges
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []  # well formed but invalid (last before first): ignored too
        except RangeNotSatisfiable:
            raise ApiError(
                416, "range_not_satisfiable",
                f"the Range {http_range[:100]!r} starts at or past the end of the file ({file_size} bytes); "
                f"ask for bytes within 0-{max(file_size - 1, 0)}, or send no Range for the whole file",
                "Range", {"Content-Range": f"bytes */{file_size}"},
            ) from None
