"""Pieces the HTML pages (`scan`, `batch`) share."""

from __future__ import annotations


def sortable_script(headers: str) -> str:
    """The page's script that sorts a table by the column whose header is clicked (again: the other way): numerically
    where both cells read as numbers, else as text; a cell's `data-v` attribute, when set, is the value sorted by.

    Args:
        headers (`str`): the CSS selector of the clickable headers (`"th"`, `"table.sortable th"`).
    """
    return """
document.querySelectorAll('%s').forEach(function(th, col){
  th.addEventListener('click', function(){
    var tbody = th.closest('table').tBodies[0];
    var rows = Array.from(tbody.rows);
    var asc = th.dataset.asc !== '1'; th.dataset.asc = asc ? '1' : '0';
    rows.sort(function(a, b){
      var x = a.cells[col].dataset.v || a.cells[col].textContent, y = b.cells[col].dataset.v || b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function(r){ tbody.appendChild(r); });
  });
});
""" % headers
