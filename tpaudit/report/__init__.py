"""Renderers: `Report` -> text. One module per output format; renderers never compute, they only draw.

- `terminal.py`: rich tables for people (`--format table`, the default)
- `json.py`: the versioned JSON contract (`--format json`)
- `markdown.py`: a pull-request comment (`--format markdown`)
- `sarif.py`: SARIF 2.1.0 for code scanning (`--format sarif`)
"""

FORMATS = ("table", "json", "markdown", "sarif")
