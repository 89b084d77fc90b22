"""Range answers that keep the API's rules, for every download.

Starlette's FileResponse answers a Range it cannot parse with a plain-text 400 and a Range past
the end of the file with an empty 416. RFC 9110 (section 14.2) lets a server ignore a Range
header it cannot use, so an unparseable one gets the whole file (200), as if it were absent; a
Range that starts past the end is a 416 in the one error shape, with the Content-Range that
tells a client the file's size. `RangeRules` goes first in the bases of any FileResponse
subclass that serves downloads.
"""

from __future__ import annotations

from starlette.responses import FileResponse, MalformedRangeHeader, RangeNotSatisfiable

from .errors import ApiError


class RangeRules:
    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []  # FileResponse sends the whole file for an empty list of ranges
        except RangeNotSatisfiable:
            raise ApiError(
                416, "range_not_satisfiable",
                f"the Range {http_range[:100]!r} starts at or past the end of the file ({file_size} bytes); "
                f"ask for bytes within 0-{max(file_size - 1, 0)}, or send no Range for the whole file",
                "Range", {"Content-Range": f"bytes */{file_size}"},
            ) from None


class Download(RangeRules, FileResponse):
    """A file from disk, with the API's Range rules."""
