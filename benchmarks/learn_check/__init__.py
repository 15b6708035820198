"""Learning checks: this project's DrQ-v2 beside the official PyTorch one (`make learn-check`).

The figure's page hooks (`TITLE`, `NOT_MEASURED`, `summary`, `report`) live in `comparison`.
"""

from benchmarks.learn_check.comparison import NOT_MEASURED, TITLE, report, summary

__all__ = ["NOT_MEASURED", "TITLE", "report", "summary"]
