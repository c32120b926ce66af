"""Re-runnable experiments behind ``fedhier experiment NAME [--quick] [--out DIR] [--seed N]``.

* :mod:`.runner` -- the shared runner: deterministic cells, resumable ``results.csv``,
  summaries as mean ± std over repetitions of fold averages;
* :mod:`.mvppca` -- the Fed-mv-PPCA evaluation suite (``EXPERIMENTS``: ``mvppca-sd``,
  ``mvppca-waic``, ``mvppca-alzheimer``, ``mvppca-mfeat``, ``mvppca-dp``);
* :mod:`.docs` -- writes the docs page of a finished run (``python -m fedhier.experiments.docs DIR``).
"""
