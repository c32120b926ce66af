"""A report page: headings, paragraphs, tables and captioned figures, written as HTML and markdown.

The HTML page is self-contained: real ``<table>`` elements, figures embedded as base64 PNG,
one inline style sheet, no scripts and no external links or images.  The markdown file holds
the same blocks in the same order; its figures are PNG files in ``figures/`` beside it.

>>> report = Report("FedLin fit", "What was fitted and on which data.")   # doctest: +SKIP
>>> report.table([{"site": "a", "MAE": 0.1}], caption="Error per site")   # doctest: +SKIP
>>> report.figure(fig, "forest", "What the figure shows and how to read it.")   # doctest: +SKIP
>>> report.write("out/")   # out/report.html, out/report.md, out/figures/forest.png   # doctest: +SKIP
"""

from __future__ import annotations

import base64
import html
import io
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..utils.io import atomic_write_bytes, atomic_write_text

__all__ = ["Report", "format_value"]

#: resolution of every figure: one figure pixel is one CSS pixel of the page at 100 % zoom; figures are at most
#: about 11.5 inches wide, so that they fit the page's 1180-pixel column without being scaled down
DPI = 100

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;font-size:16px;line-height:1.45;
 color:#1d1d1f;max-width:1180px;margin:0 auto;padding:16px 28px 48px}
h1{font-size:28px;margin:8px 0 4px}h2{font-size:22px;margin:30px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:18px;margin:20px 0 6px}
table{border-collapse:collapse;margin:8px 0 18px;font-size:15px;max-width:100%}
caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0}
th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}td{overflow-wrap:anywhere}td.num{text-align:right;font-variant-numeric:tabular-nums}
th{background:#f2f2f4}tr:nth-child(even) td{background:#fafafa}
figure{margin:10px 0 24px}figure img{display:block;max-width:100%;height:auto;border:1px solid #eee}
figcaption{max-width:1000px;margin-top:6px;font-size:15px;color:#333}
pre{background:#f5f5f7;padding:8px 12px;white-space:pre-wrap;overflow-wrap:anywhere;font-size:14px}code{font-size:14px}
"""


def format_value(value: Any) -> str:
    """A table cell as text: integers as they are, other numbers with 4 significant digits."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return "–"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class _Block:
    kind: str  # "heading", "paragraph", "command", "table", "figure"
    text: str = ""
    level: int = 2
    rows: tuple = ()
    columns: tuple = ()
    png: bytes = b""
    name: str = ""
    width: int = 0


class Report:
    """An ordered list of blocks rendered to ``report.html`` and ``report.md``.

    Parameters
    ----------
    title : str
        The page's title (first heading).
    intro : str
        A plain-language paragraph under the title: what was fitted, on which data.
    """

    def __init__(self, title: str, intro: str = ""):
        self.title = title
        self.blocks: list[_Block] = []
        if intro:
            self.paragraph(intro)

    # ------------------------------------------------------------------ blocks
    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(_Block("heading", text=text, level=level))

    def paragraph(self, text: str) -> None:
        """Plain text (no markup; it is escaped in the HTML)."""
        self.blocks.append(_Block("paragraph", text=text))

    def command(self, text: str) -> None:
        """A command line the reader can run (shown as code)."""
        self.blocks.append(_Block("command", text=text))

    def table(self, rows: Sequence[Mapping[str, Any]], caption: str = "", columns: Sequence[str] | None = None) -> None:
        """A table of dict rows (columns: given order, else first-seen order); numbers by :func:`format_value`."""
        if columns is None:
            columns = list(dict.fromkeys(k for row in rows for k in row))
        cells = tuple(tuple(format_value(row.get(c)) for c in columns) for row in rows)
        numeric = tuple(
            all(isinstance(row.get(c), numbers.Number) and not isinstance(row.get(c), bool) for row in rows if row.get(c) is not None)
            for c in columns
        )
        self.blocks.append(_Block("table", text=caption, rows=cells, columns=tuple(zip(columns, numeric))))

    def figure(self, fig: Any, name: str, caption: str) -> None:
        """A matplotlib figure, rendered at :data:`DPI` and closed; ``caption`` says what it shows and how to read it."""
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.15)
        plt.close(fig)
        png = buf.getvalue()
        if any(b.name == name for b in self.blocks if b.kind == "figure"):
            raise ValueError(f"a figure named {name!r} is already in this report")
        width = int.from_bytes(png[16:20], "big")  # the IHDR chunk: width, then height
        self.blocks.append(_Block("figure", text=caption, png=png, name=name, width=width))

    # ------------------------------------------------------------------ output
    def to_html(self) -> str:
        esc = html.escape
        parts = [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(self.title)}</title><style>{_STYLE}</style></head><body>",
            f"<h1>{esc(self.title)}</h1>",
        ]
        for b in self.blocks:
            if b.kind == "heading":
                parts.append(f"<h{b.level}>{esc(b.text)}</h{b.level}>")
            elif b.kind == "paragraph":
                parts.append(f"<p>{esc(b.text)}</p>")
            elif b.kind == "command":
                parts.append(f"<pre><code>{esc(b.text)}</code></pre>")
            elif b.kind == "table":
                head = "".join(f"<th>{esc(c)}</th>" for c, _ in b.columns)
                body = "".join(
                    "<tr>" + "".join(
                        f'<td class="num">{esc(v)}</td>' if num else f"<td>{esc(v)}</td>" for v, (_, num) in zip(row, b.columns)
                    ) + "</tr>"
                    for row in b.rows
                )
                caption = f"<caption>{esc(b.text)}</caption>" if b.text else ""
                parts.append(f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            else:
                data = base64.b64encode(b.png).decode("ascii")
                parts.append(
                    f'<figure id="{esc(b.name)}"><img src="data:image/png;base64,{data}" width="{b.width}" '
                    f'alt="{esc(b.name)}"><figcaption>{esc(b.text)}</figcaption></figure>'
                )
        parts.append("</body></html>\n")
        return "\n".join(parts)

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        for b in self.blocks:
            if b.kind == "heading":
                lines += ["#" * b.level + " " + b.text, ""]
            elif b.kind == "paragraph":
                lines += [b.text, ""]
            elif b.kind == "command":
                lines += ["```", b.text, "```", ""]
            elif b.kind == "table":
                cell = lambda v: v.replace("|", "\\|")  # noqa: E731
                if b.text:
                    lines += [f"**{b.text}**", ""]
                lines.append("| " + " | ".join(cell(c) for c, _ in b.columns) + " |")
                lines.append("|" + "|".join("---:" if num else "---" for _, num in b.columns) + "|")
                lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in b.rows]
                lines.append("")
            else:
                lines += [f"![{b.name}](figures/{b.name}.png)", "", f"*{b.text}*", ""]
        return "\n".join(lines)

    def write(self, out_dir: str | Path) -> Path:
        """Write ``report.html``, ``report.md`` and ``figures/*.png`` into ``out_dir``; returns the HTML path."""
        out = Path(out_dir)
        for b in self.blocks:
            if b.kind == "figure":
                atomic_write_bytes(out / "figures" / f"{b.name}.png", b.png)
        atomic_write_text(out / "report.md", self.to_markdown())
        return atomic_write_text(out / "report.html", self.to_html())
