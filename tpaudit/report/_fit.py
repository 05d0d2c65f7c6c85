"""Terminal tables that say when they do not fit: a table whose columns need more than the console's width has some
cells shortened by rich (`14.96 G…`, `131,…`), so the renderer prints one line under it naming the width that shows
every cell whole (`--width N`, or `--format markdown`). A figure is never shortened without a word.
"""

from __future__ import annotations

_ELLIPSIS = "…"
_UNBOUNDED = 10_000  # columns at which no cell of a report's table is shortened (rich would crop past it anyway)


def _ellipses(table, width: int) -> int:
    """How many `…` rich draws when it renders `table` `width` columns wide (without colour, into a buffer)."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, markup=False, emoji=False,
            legacy_windows=False).print(table)
    return buffer.getvalue().count(_ELLIPSIS)


def needed_width(console, table) -> int | None:
    """The fewest columns at which rich draws `table` with no cell shortened, when the console's width shortens some;
    `None` when every cell fits. Found by drawing the table into buffers (rich's column widths are not monotone in a
    way its measurement predicts: the smallest width with as many `…` as an unbounded one, by bisection between the
    console's width and the table's widest natural width)."""
    from rich.measure import Measurement

    whole = _ellipses(table, _UNBOUNDED)  # `…` the data itself holds
    if _ellipses(table, console.width) <= whole:
        return None
    low = console.width  # shortens
    high = max(Measurement.get(console, console.options.update_width(_UNBOUNDED), table).maximum, low + 1)
    if _ellipses(table, high) > whole:
        return None  # nothing within reach draws it whole; the note would name no width
    while high - low > 1:
        mid = (low + high) // 2
        if _ellipses(table, mid) > whole:
            low = mid
        else:
            high = mid
    return high


def print_table(console, table) -> None:
    """`console.print(table)`, then a dim note when some cell was shortened to fit (see the module). A table whose
    columns all fold (`overflow="fold"`: a word too long for its column continues on the next line) never shortens a
    cell, and is not drawn again to find out."""
    from rich.text import Text

    console.print(table)
    if all(column.overflow == "fold" for column in table.columns):
        return
    need = needed_width(console, table)
    if need is not None:
        console.print(Text(f"(cells above shortened to fit {console.width} columns: --width {need} or --format "
                           "markdown shows them whole)", style="dim"))
