"""tpaudit: lint tensor-parallel sharding plans of Hugging Face transformers models before anyone rents GPUs."""

__version__ = "0.1.0"
