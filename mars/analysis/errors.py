"""The one error of the analysis tools: bad input that the user can fix, said in one line."""

from __future__ import annotations


class AnalysisError(ValueError):
    """Input the analysis cannot use (no runs, runs without metrics, incomparable runs, a bad option).

    The message is one line naming the file or key and what to do; the scripts print it as
    ``error: MESSAGE`` and exit with status 2.
    """
