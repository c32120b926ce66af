"""Reports of the command line: one self-contained HTML page plus the same content as markdown.

* :mod:`fedhier.report.document` -- the page: headings, paragraphs, tables, captioned figures.
* :mod:`fedhier.report.mvppca` -- Fed-mv-PPCA (``fedhier demo``, ``fedhier fit``, Flower result folders).
* :mod:`fedhier.report.fedlin` -- FedLin (``fedhier fit linear``).
* :mod:`fedhier.report.collab` -- CollabDict (``fedhier collab fit``).

Only the command line imports this package; matplotlib is imported when a figure is drawn.
"""
