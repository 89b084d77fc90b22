"""Issue 38, item 7: what a word or an emoji of its script needs is kept, look-alikes are refused.

Joiners (ZWNJ, ZWJ), variation selectors and tag characters are invisible, and were refused
everywhere; but a Persian word needs its ZWNJ, a Devanagari or Sinhala conjunct its ZWJ after
the virama, an emoji ZWJ sequence its ZWJ, `❤️` its VS16, a keycap or the England flag their
selector and tags, a Japanese name its ideographic variation selector. Kept exactly where
Unicode's joiner and emoji rules give them a meaning (the `regex` module's Unicode properties);
anywhere else they still are refused. Separators other than U+0020, a term of combining marks
alone and U+FFFD were accepted; each is refused now, naming its code point."""

from __future__ import annotations

import pytest

from .conftest import TINY_MODEL
from .test_api_inputs import assert_error, submit

NEEDED = [
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian می‌خواهم: ZWNJ between joining letters
    "\U0001f469\u200d\U0001f4bb",  # 👩‍💻 woman technologist: emoji ZWJ sequence
    "\u0915\u094d\u200d\u0937",  # Devanagari क्‍ष: ZWJ after the virama (half form)
    "\u0dc1\u0dca\u200d\u0dbb\u0dd3",  # Sinhala ශ්‍රී: ZWJ after the al-lakuna (rakaaransaya)
    "\u2764\ufe0f",  # ❤️ red heart: emoji presentation selector
    "1\ufe0f\u20e3",  # 1️⃣ keycap
    "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",  # England flag tag sequence
    "\u845b\U000e0100",  # 葛󠄀 Japanese ideographic variation sequence (VS17)
    "\u795e\ufe00",  # 神︀ standardized variant (the CJK compatibility form)
    "\U0001f3f3\ufe0f\u200d\U0001f308",  # 🏳️‍🌈 rainbow flag: VS16 then ZWJ
    "\U0001f44b\U0001f3fd",  # 👋🏽 skin tone modifier (visible, always was kept)
]


def _cancel(client, auth, response) -> None:
    client.post(f"/jobs/{response.json()['id']}/cancel", headers=auth)  # not for the session's worker


@pytest.mark.parametrize("term", NEEDED)
def test_joiners_and_selectors_a_word_or_emoji_needs_are_accepted(client, auth, term):
    response = submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming", term]})
    assert response.status_code == 202, response.text
    _cancel(client, auth, response)


@pytest.mark.parametrize("term, named", [
    ("foo\u00a0barqux", "U+00A0 NO-BREAK SPACE"),
    ("foo\u202fbarqux", "U+202F NARROW NO-BREAK SPACE"),
    ("ideo\u3000graphic", "U+3000 IDEOGRAPHIC SPACE"),
    ("\u0301", "U+0301 COMBINING ACUTE ACCENT"),
    ("\u0301\u0308", "U+0301 COMBINING ACUTE ACCENT"),
    ("mojibake\ufffd", "U+FFFD REPLACEMENT CHARACTER"),
    # the same invisible characters where no rule gives them a meaning: still look-alikes
    ("pay\u200cload", "U+200C ZERO WIDTH NON-JOINER"),  # Latin letters do not join
    ("pay\u200dload", "U+200D ZERO WIDTH JOINER"),
    ("\U0001f469\u200d", "U+200D ZERO WIDTH JOINER"),  # nothing to join to
    ("kernel\ufe0f", "U+FE0F VARIATION SELECTOR-16"),  # 'l' has no emoji presentation
    ("kernel\ufe00", "U+FE00 VARIATION SELECTOR-1"),
    ("\u2764\ufe0f\ufe0f", "U+FE0F VARIATION SELECTOR-16"),  # a selector after a selector
    ("kernel\U000e0100", "U+E0100 VARIATION SELECTOR-17"),  # not an ideograph
    ("flag\U000e0067\U000e0062\U000e007f", "U+E0067 TAG LATIN SMALL LETTER G"),  # tags after a letter
    ("\U0001f3f4\U000e0067\U000e0062", "U+E0067 TAG LATIN SMALL LETTER G"),  # no CANCEL TAG at the end
])
def test_look_alikes_are_refused_naming_the_code_point(client, auth, term, named):
    response = submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming", term]})
    error = assert_error(response, 422, "terms[1]", "invalid_terms")
    assert named in error["message"], error["message"]


def test_the_nbsp_twin_of_a_term_is_refused_not_added_as_a_second_term(client, auth):
    response = submit(client, auth, {"base_model": TINY_MODEL, "terms": ["foo barqux", "foo\u00a0barqux"]})
    error = assert_error(response, 422, "terms[1]", "invalid_terms")
    assert "U+00A0" in error["message"] and "U+0020" in error["message"]
