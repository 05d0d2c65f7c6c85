"""Rendering what strangers wrote inert: one function per output format.

Tensor names, rule keys, config strings (`architectures[0]`, `model_type`), LIST entries, repo ids, paths and the
reasons quoting them are written by whoever published a model or a list. Every renderer passes each such string
through the function of its format here, and through nothing else, so what a string may do to a terminal, a
pull-request comment or a web page is decided in one place:

- **terminal** (`terminal`): control characters (C0, DEL, C1: `ESC [2J`, an unterminated OSC `ESC ]`, a bare CSI
  `\\x9b`), line and paragraph separators and bidirectional overrides (U+202E and kin, which reorder what a reviewer
  reads) and the other invisible format characters (zero-width space and joiners, word joiner, BOM: Unicode's
  category Cf, which make two different names print alike) are written as visible escapes (`\\x1b`, `\\u202e`,
  `\\u200b`). Rich markup is never interpreted from data: the
  consoles renderers draw on are made with `markup=False` (`tpaudit/cli/_output.py`), so `x[/]y` prints as written.
- **Markdown** (`markdown_code`, `markdown_text`): a name becomes a code span whose backtick fence is longer than any
  run of backticks inside it, so data cannot close it; prose (a finding message, a reason) keeps the code spans
  tpaudit wrote (each re-fenced by `markdown_code`) and, outside them, has HTML's `& < >` written as entities and
  Markdown's punctuation (`* _ [ ] ! | ~ # \\`) escaped, so no tag, image, link, heading or table cell is made from
  data. Newlines never reach the output (a repo id with a newline cannot end a heading early).
- **HTML** (`html`): `html.escape` with quotes, plus the terminal's visible escapes for control characters.

JSON and SARIF need nothing here: `json.dumps` escapes every control character and the data stays exact.
"""

from __future__ import annotations

import html as _html
import re

__all__ = ["terminal", "markdown_code", "markdown_fence", "markdown_text", "strings_in", "html", "visible"]

# C0 controls, DEL, C1 controls, the Unicode line/paragraph separators and the bidirectional formatting characters
# (embeddings, overrides, isolates, marks): everything that can move the cursor, rewrite the screen, start a terminal
# escape sequence or make text read in another order than it is stored.
# Also every other character of Unicode's general category Cf ("format": invisible, it only changes how neighbours
# render or join): zero-width space, non-joiner and joiner (U+200B-U+200D), word joiner and invisible operators
# (U+2060-U+2064), the BOM (U+FEFF), soft hyphen, Arabic/Syriac number marks, interlinear annotation, Egyptian and
# Duployan format controls, musical format controls and the language tags (U+E0001, U+E0020-U+E007F). They make two
# different names print the same (`q_proj` and `q\u200b_proj`). The ranges are Unicode 15.1's Cf set.
_FORMAT = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
           "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
           "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f")
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_FORMAT}]")
_CONTROL_NO_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029{_FORMAT}]")
_MD_PUNCT = re.compile(r"([\\*_\[\]!|~#])")
_BACKTICKS = re.compile("`+")


def _escape_char(m: re.Match) -> str:
    c = m.group(0)
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def visible(value, *, keep_newlines: bool = False) -> str:
    """`value` as text with every control character written as a visible escape (`"\\x1b"`).

    Args:
        value: anything; `None` becomes `""`, other non-strings `str(value)`.
        keep_newlines (`bool`, *optional*, defaults to `False`): leave `"\\n"` as a line break (a multi-line
            snippet tpaudit composed); every other control character is still escaped.
    """
    text = "" if value is None else value if isinstance(value, str) else str(value)
    pattern = _CONTROL_NO_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(_escape_char, text) if pattern.search(text) else text


def terminal(value, *, keep_newlines: bool = False) -> str:
    """`value` safe to print on a terminal through rich (consoles with `markup=False`): see `visible`.

    Example: `terminal("a\\x1b[2Jb")` -> `"a\\\\x1b[2Jb"` (prints as `a\\x1b[2Jb`, the screen stays).
    """
    return visible(value, keep_newlines=keep_newlines)


def markdown_code(value, *, table: bool = True) -> str:
    """`value` as one Markdown code span that nothing inside it can close.

    The fence is one backtick longer than the longest run of backticks in the value (CommonMark: a span closes only
    at a run of exactly its fence's length); a value starting or ending with a backtick is padded with a space.
    Control characters (newlines included) become visible escapes; with `table` (the default) `|` is written `\\|`,
    which GitHub's tables require even inside a code span.

    Example: ``markdown_code("a`b")`` -> ``"``a`b``"``.
    """
    text = visible(value)
    if table:
        text = text.replace("|", "\\|")
    runs = _BACKTICKS.findall(text)
    fence = "`" * (max(map(len, runs), default=0) + 1)
    if text.startswith("`") or text.endswith("`") or not text.strip():
        text = f" {text} "
    return f"{fence}{text}{fence}"


def markdown_fence(value, info: str = "") -> list[str]:
    """A multi-line value (a plan snippet quoting rule keys) as the lines of a fenced code block that nothing inside
    it can close: the fence is three backticks, or one more than the longest run of backticks in the value. Control
    characters other than newlines become visible escapes.

    Returns:
        `list[str]`: the opening fence (with `info`, e.g. `"python"`), the value's lines, the closing fence.
    """
    text = visible(value, keep_newlines=True)
    fence = "`" * max(3, max(map(len, _BACKTICKS.findall(text)), default=0) + 1)
    return [f"{fence}{info}", *text.split("\n"), fence]


def _md_plain(text: str) -> str:
    return _MD_PUNCT.sub(r"\\\1", _html.escape(text, quote=False))


def markdown_text(value, names=()) -> str:
    """Prose for Markdown (a finding message, a reason, a note): the code spans in it (text between backticks, as
    tpaudit's messages quote names) are kept as code spans, each re-fenced by `markdown_code`; the rest has `& < >`
    as HTML entities and `* _ [ ] ! | ~ # \\` backslash-escaped. Newlines and tabs become spaces, other control
    characters visible escapes. An unpaired backtick is shown as a character.

    A name that itself holds a backtick cannot be told from the end of its quote by reading the prose: pass such names
    (the finding's target and facts, the model's architecture: what strangers wrote) as `names`, and each one quoted
    in the text as `` `name` `` becomes one code span, whole.

    Example: ``markdown_text("`w<x` replicated <img src=x>")`` -> ``"`w<x` replicated &lt;img src=x&gt;"``.
    """
    raw = str(value) if value is not None else ""
    spans: list = []
    for name in sorted({n for n in names if isinstance(n, str) and "`" in n}, key=len, reverse=True):
        quoted = f"`{name}`"
        if quoted in raw:
            raw = raw.replace(quoted, f"\ue000{len(spans)}\ue001")
            spans.append(markdown_code(name))
    text = visible(" ".join(raw.replace("\t", " ").splitlines()))
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: the last one opens nothing
        parts[-2:] = [parts[-2] + "\x00" + parts[-1]]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(markdown_code(part))
        else:
            out.append(_md_plain(part).replace("\x00", "\\`"))
    rendered = "".join(out)
    for i, span in enumerate(spans):
        rendered = rendered.replace(f"\ue000{i}\ue001", span)
    return rendered


def strings_in(value, limit: int = 10_000) -> list[str]:
    """Every string inside `value` (dicts' keys and values, lists, dataclass-free JSON-like data), at most `limit`:
    the names a report carries, for `markdown_text(names=...)`."""
    out: list[str] = []
    stack = [value]
    while stack and len(out) < limit:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return out


def html(value) -> str:
    """`value` as HTML text or an attribute value: `& < > " '` as entities, control characters as visible escapes."""
    return _html.escape(visible(value), quote=True)
