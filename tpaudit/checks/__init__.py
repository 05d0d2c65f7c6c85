"""Finding families (one module each) and the registry that runs them. See `registry.py`."""

from .registry import CheckContext, CheckOptions, all_rules, get_rule, run_checks

__all__ = ["CheckContext", "CheckOptions", "all_rules", "get_rule", "run_checks"]
