"""Running the pipeline: `pipeline.py` (`Audit`: one model at one set of sizes, the stages in order), `scan.py` (every
model type transformers knows), `batch/` (many models at several sizes, cached) and the executor `scan` and `batch`
share (`executor.py`: a process pool or Ray)."""
