"""What strangers wrote is drawn inert by every renderer (issue: names, configs, lists written by someone else).

One hostile string goes everywhere a stranger can put text: a checkpoint tensor name, a `--plan` rule key, config.json's
`architectures[0]`, a model directory's name (hence `repo_id`/`ref` and batch's `model`), a LIST entry, a `--compare`
file's finding target, and (for `scan`, whose rows come from transformers) a row's model type, reason and family.
Each output is then judged by an independent reader, never by tpaudit's own escaping:

- terminal: no control character (C0 but newline, DEL, C1) and no bidirectional override reaches the output; the
  escape sequence is shown as text (`\\x1b[2J`) and rich markup in the data (`x[/]y`, `[bold]`) prints as written;
- Markdown: rendered to HTML by markdown-it-py (CommonMark + GFM tables); no element other than the ones the
  renderer writes itself comes out (no `img`, `script`, `a`), and the hostile text survives whole inside one element;
- HTML: parsed by the standard library; only the renderer's own tags, the hostile text as text;
- JSON / SARIF: the exact hostile string round-trips.
"""

from __future__ import annotations

import json
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import CASES, run_env, run_main

# ESC [2J clears the screen; ESC ] opens an OSC that is never terminated; 0x9b is an 8-bit CSI; a backtick closes a
# Markdown code span; rich markup; HTML; a newline that would end a heading; a table pipe; a right-to-left override.
HOSTILE = "\x1b[2J\x1b]0;pwn\x9b31m`<img src=x onerror=alert(1)>`|x[/]y[bold]<script>alert(1)</script>\n# h\u202e!"
VISIBLE = "\\x1b[2J\\x1b]0;pwn\\x9b31m`<img src=x onerror=alert(1)>`|x[/]y[bold]<script>alert(1)</script>\\x0a# h\\u202e!"
"""HOSTILE as tpaudit shows it: every control character as a visible escape, nothing else changed."""
IN_PATH = HOSTILE.replace("/", "%")  # a directory name cannot hold "/"
VISIBLE_PATH = VISIBLE.replace("/", "%")
ONE_LINE, VISIBLE_ONE_LINE = IN_PATH.replace("\n", ""), VISIBLE_PATH.replace("\\x0a", "")
# characters that must never reach a terminal from data: C0 (but newline), DEL, C1, bidi controls
_RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def hostile_model(root: Path, name: str = IN_PATH, text: str = HOSTILE) -> Path:
    """A 2-layer granite whose directory name, architectures[0] and one stray checkpoint tensor carry `text`."""
    config = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    config.update(num_hidden_layers=2, architectures=["Evil" + text])
    d = root / ("m" + name)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    hidden = config["hidden_size"]
    header = {"model.norm.weight": {"dtype": "BF16", "shape": [hidden], "data_offsets": [0, 2 * hidden]},
              "model.layers.0.stray" + text: {"dtype": "BF16", "shape": [2],
                                                 "data_offsets": [2 * hidden, 2 * hidden + 4]}}
    raw = json.dumps(header).encode()
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2 * hidden + 4)
    return d


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    model = hostile_model(root)
    plan = root / "plan.json"
    plan.write_text(json.dumps({"layers.*.self_attn.q_proj": "colwise", "layers.*.zz" + HOSTILE: "rowwise"}))
    return model, plan, root


PROSE = VISIBLE.replace("`", "").replace("\\x0a", " ")
"""HOSTILE inside a sentence, as rendered Markdown reads: newlines are spaces, backticks delimit code spans."""


# ----------------------------------------------------------------------------------------------------------------------
# independent readers
# ----------------------------------------------------------------------------------------------------------------------
def assert_terminal_inert(text: str, *needles: str) -> None:
    raw = _RAW.search(text)
    assert raw is None, (repr(raw.group(0)), text[max(0, raw.start() - 80):raw.start() + 80])
    for needle in needles:
        assert needle in text, (needle, text[:2000])


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []
        self.stack: list[str] = []
        self.elements: list[tuple[str, str]] = []  # (tag, text of the innermost element)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.stack.append(tag)
        self.elements.append((tag, ""))

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self.elements:
            tag, old = self.elements[-1]
            self.elements[-1] = (tag, old + data)


def parse_html(text: str) -> _Tags:
    p = _Tags()
    p.feed(text)
    p.close()
    return p


MARKDOWN_TAGS = {"h3", "h4", "p", "table", "thead", "tbody", "tr", "th", "td", "code", "details", "summary", "sub",
                 "blockquote", "ul", "li", "pre", "strong", "em", "br", "hr"}


def assert_markdown_inert(text: str, needle: str = VISIBLE) -> _Tags:
    """Render with markdown-it-py (CommonMark + GFM tables): only the renderer's own elements, and `needle` whole in
    one code element (or one cell's text)."""
    from markdown_it import MarkdownIt

    assert _RAW.search(text) is None, text
    html = MarkdownIt("commonmark").enable("table").render(text)
    tags = parse_html(html)
    assert set(tags.tags) <= MARKDOWN_TAGS, (set(tags.tags) - MARKDOWN_TAGS, html[:3000])
    assert any(needle in body for _, body in tags.elements), (needle, html[:3000])
    headings = [body for tag, body in tags.elements if tag in ("h3", "h4")]
    assert not any(h.startswith(" h") for h in headings), headings  # the newline did not start a heading
    return tags


def assert_html_inert(text: str, scripts: int, needle: str = VISIBLE) -> None:
    assert _RAW.search(text) is None
    tags = parse_html(text)
    assert "img" not in tags.tags and tags.tags.count("script") == scripts, sorted(set(tags.tags))
    assert needle in "".join(tags.text)


def contains(value, needle: str) -> bool:
    """`needle` is a substring of some string inside the JSON value."""
    if isinstance(value, str):
        return needle in value
    if isinstance(value, dict):
        return any(contains(k, needle) or contains(v, needle) for k, v in value.items())
    if isinstance(value, list):
        return any(contains(v, needle) for v in value)
    return False


# ----------------------------------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------------------------------
WIDE = {"COLUMNS": "4000"}  # terminal tables drawn without wrapping, so a needle is never cut by a line break


def _check(hostile, fmt: str):
    model, plan, _ = hostile
    proc = run_env("check", str(model), "--tp", "2", "--plan", str(plan), "--no-parity", "--format", fmt, env=WIDE)
    assert proc.returncode == 1, proc.stderr  # the stray rule and the indivisible vocab are error findings
    return proc.stdout


def test_check_table_is_inert(hostile):
    out = _check(hostile, "table")
    assert_terminal_inert(out, VISIBLE_PATH, "stray" + VISIBLE, "zz" + VISIBLE, "x[/]y[bold]")


def test_check_markdown_is_inert(hostile):
    out = _check(hostile, "markdown")
    tags = assert_markdown_inert(out, "stray" + VISIBLE)
    heading = [body for tag, body in tags.elements if tag == "code" and VISIBLE_PATH in body]
    assert heading, out[:500]  # the model's path, newline and all, stays inside the heading's code span
    assert out.splitlines()[0].startswith("### ") and VISIBLE_PATH in out.splitlines()[0]
    assert "Evil" + PROSE in "".join(tags.text)  # architectures[0] in the notes
    # a name quoted in a finding's message (the stray tensor, TPA301) is one code span, whole, although it holds a
    # backtick: no element carries a piece of it
    codes = [body for tag, body in tags.elements if tag == "code"]
    assert len([c for c in codes if "stray" in c]) >= 3, codes  # the target cell and the message's quotes
    assert all("stray" + VISIBLE in c for c in codes if "stray" in c), [c for c in codes if "stray" in c]


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_check_json_and_sarif_keep_the_exact_strings(hostile, fmt):
    doc = json.loads(_check(hostile, fmt))
    assert contains(doc, "stray" + HOSTILE) and contains(doc, "zz" + HOSTILE)


# zero-width space, zero-width non-joiner and joiner, word joiner, BOM, soft hyphen, a language tag: printed raw they
# are invisible, so `stray<ZWSP>x` would read as `strayx`. Written as the code points an independent table gives.
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad\U000e0041"
INVISIBLE_SHOWN = "\\u200b\\u200c\\u200d\\u2060\\ufeff\\xad\\U000e0041"


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_zero_width_characters_are_shown_escaped(tmp_path, fmt):
    import unicodedata

    assert {unicodedata.category(c) for c in INVISIBLE} == {"Cf"}
    model = hostile_model(tmp_path, "zw", text="q" + INVISIBLE + "x")
    proc = run_env("check", str(model), "--tp", "2", "--no-parity", "--format", fmt, env=WIDE)
    assert proc.returncode == 1, proc.stderr
    assert not any(c in proc.stdout for c in INVISIBLE), [c for c in INVISIBLE if c in proc.stdout]
    assert "strayq" + INVISIBLE_SHOWN + "x" in proc.stdout.replace("\\\\", "\\"), proc.stdout[:3000]


# ----------------------------------------------------------------------------------------------------------------------
# batch
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def batch_files(hostile):
    _, _, root = hostile
    model = hostile_model(root / "batch", ONE_LINE)  # a LIST entry is one line
    listing = root / "list.txt"
    # the model itself, an entry that is not a model (rich markup and an escape), a Hub-looking entry with HTML
    listing.write_text("\n".join([str(model), "x[/]y\x1b[2J", "acme/<script>alert(1)</script>"]) + "\n",
                       encoding="utf-8")
    old = root / "old.jsonl"
    old.write_text(json.dumps({"schema": "tpaudit/batch/v1", "model": str(model), "tp_size": 2, "ep_size": 1,
                               "status": "ok", "exit_code": 1, "worst_rank_param_bytes": 1, "total_param_bytes": 2,
                               "replicated_bytes": 1, "errors": 1, "warnings": 0, "notes": 0,
                               "findings": [{"code": "TPA001", "kind": "replicated_weight", "severity": "error",
                                             "target": "gone" + HOSTILE, "message": "m", "fix": "f", "facts": {}}],
                               "seconds": 0.1}) + "\n")
    return listing, old, root


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_batch_summaries_are_inert(batch_files, fmt):
    listing, old, root = batch_files
    out = root / f"out-{fmt}.jsonl"
    env_cache = {"TPAUDIT_CACHE": str(root / "cache"), "HF_HUB_OFFLINE": "1", **WIDE}
    proc = run_env("batch", str(listing), "--tp", "2", "-o", str(out), "--compare", str(old), "--format", fmt,
                   env=env_cache)
    assert proc.returncode == 1, proc.stderr  # the hostile model has error findings, and they are new
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["model"] for line in lines] == [listing.read_text().splitlines()[0], "x[/]y\x1b[2J",
                                                 "acme/<script>alert(1)</script>"]
    assert [line["status"] for line in lines] == ["ok", "error", "error"]
    if fmt == "table":
        assert_terminal_inert(proc.stdout, VISIBLE_ONE_LINE, "x[/]y\\x1b[2J", "gone" + VISIBLE)
    elif fmt == "markdown":
        tags = assert_markdown_inert(proc.stdout, "acme/<script>alert(1)</script>")
        assert "gone" + PROSE in "".join(tags.text) and VISIBLE_ONE_LINE in "".join(tags.text)
    else:
        assert_html_inert(proc.stdout, scripts=1, needle="gone" + VISIBLE)
        assert "acme/<script>alert(1)</script>" in "".join(parse_html(proc.stdout).text)


# ----------------------------------------------------------------------------------------------------------------------
# scan: rows come from transformers' registry, so the renderers get a hand-made report
# ----------------------------------------------------------------------------------------------------------------------
def _scan_report():
    from tpaudit.run.scan import ScanReport, ScanResult

    rows = [ScanResult("evil" + HOSTILE, "build_failed", reason="ValueError: " + HOSTILE),
            ScanResult("ok" + HOSTILE, "ok", architecture="A" + HOSTILE, total_param_bytes=100, replicated_bytes=50,
                       worst_rank_param_bytes=60,
                       replicated=[{"name": "fam" + HOSTILE, "bytes": 50, "count": 1, "severity": "error"}],
                       findings=[{"code": "TPA001", "severity": "error", "target": "fam" + HOSTILE}],
                       components={"mlp": {"bytes": 100, "replicated_bytes": 50}})]
    return ScanReport(tp_size=4, models=rows, versions={"tpaudit": "0"}, selected=["x"], seconds=1.0)


@pytest.mark.parametrize("fmt", ["table", "markdown", "html", "json"])
def test_scan_renderers_are_inert(fmt):
    import contextlib
    import io
    from unittest import mock

    from tpaudit.cli._output import emit

    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.dict("os.environ", WIDE):
        emit("scan", fmt, _scan_report(), None)
    text = out.getvalue()
    if fmt == "table":
        assert_terminal_inert(text, "x[/]y[bold]", "\\x1b[2J")
    elif fmt == "markdown":
        assert_markdown_inert(text, "evil" + VISIBLE)
        assert "fam" + PROSE in "".join(assert_markdown_inert(text, "evil" + VISIBLE).text)
    elif fmt == "html":
        assert_html_inert(text, scripts=1, needle="ok" + VISIBLE)
    else:
        assert contains(json.loads(text), "fam" + HOSTILE)


# ----------------------------------------------------------------------------------------------------------------------
# size
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["table", "json", "html"])
def test_size_renderers_are_inert(hostile, fmt):
    model, plan, _ = hostile
    proc = run_env("size", str(model), "--gpu", "L4", "--tp", "1,2", "--training", "--format", fmt, env=WIDE)
    assert proc.returncode == 0, proc.stderr  # 2 layers fit an L4
    if fmt == "table":
        assert_terminal_inert(proc.stdout, VISIBLE_PATH, "Evil" + VISIBLE)
    elif fmt == "html":
        assert_html_inert(proc.stdout, scripts=0, needle="Evil" + VISIBLE)
    else:
        assert contains(json.loads(proc.stdout), "Evil" + HOSTILE)


def test_error_lines_on_stderr_are_inert(tmp_path):
    """A path quoted in an error message cannot drive the terminal either."""
    proc = run_main("check", str(tmp_path / ("nope" + IN_PATH)), "--tp", "2")
    assert proc.returncode == 2
    assert_terminal_inert(proc.stderr, "nope" + VISIBLE_PATH.replace("\\x0a", " "))  # folded onto one line


# ----------------------------------------------------------------------------------------------------------------------
# a plan of many rules: the terminal draws in time proportional to what it shows, not to the plan
# ----------------------------------------------------------------------------------------------------------------------
def test_the_table_of_a_huge_plan_is_drawn_in_bounded_work_and_memory(hostile):
    """A 15 MiB --plan (300,000 dead rules, each a TPA002 warning) took 4 minutes and 3 GB in the table renderer.
    The table now draws the first findings and counts the rest; its cost must not grow with the plan."""
    import io
    import tracemalloc

    from rich.console import Console

    from conftest import audit, count_calls
    from tpaudit.report import get
    from tpaudit.report.terminal import FINDING_ROWS

    model, _, _ = hostile
    costs = []
    for n in (2_000, 40_000):
        plan = {f"layers.*.no_such_module_{i}": "colwise" for i in range(n)}
        report = audit(str(model), 2, plan=plan)
        assert sum(f.code == "TPA002" for f in report.findings) == n
        buffer = io.StringIO()
        tracemalloc.start()
        calls, _ = count_calls(lambda: get("check", "table").fn(
            report, Console(file=buffer, width=160, no_color=True, markup=False)))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        text = buffer.getvalue()
        assert f"and {n + len(report.findings) - n - FINDING_ROWS:,} more" in text
        costs.append((calls, peak, text.count("\n")))
    (small_calls, small_peak, small_lines), (big_calls, big_peak, big_lines) = costs
    assert abs(big_lines - small_lines) <= 2              # 20 times the rules, the same drawing (a longer count)
    # a finding past the drawn rows is only counted: a few calls each (drawing each took thousands), and the memory
    # stays small (was minutes and GBs; the time is scripts/benchmark.py --section plans)
    assert (big_calls - small_calls) / 38_000 < 10 and big_peak < 64 * 2**20, costs
