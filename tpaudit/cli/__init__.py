"""The command line. `app.py` only assembles; each command lives in its own module and imports torch and transformers
lazily, so `tpaudit --help` stays fast."""
