"""Running the pipeline for many inputs: the executor `scan` and `batch` share (`executor.py`)."""
