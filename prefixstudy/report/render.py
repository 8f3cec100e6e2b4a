"""Stage: report (rendering).  One list of blocks in; report.md and a self-contained report.html out.

Both documents come from the same blocks, so they never disagree.  A block is a tuple:
("h2", text), ("p" | "headline" | "meta", text), ("list", [text]), ("table", DataFrame),
("list", [text], html_class), ("fig", SavedFigure) or ("row", [[block, ...], ...], id): columns side by side in HTML (the first
screen's figure beside its table), one after another in markdown.  Markdown links the figures under
plots/; HTML embeds each PNG.  No markdown line is longer than ``MD_LINE_MAX``: a longer paragraph
breaks between sentences, else between words (a soft break, so it renders as one paragraph).
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from prefixstudy.results import atomic_write_text

PLOTS_DIR = "plots"
FORMATS = ("png", "svg")  # every figure is saved in each
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
SAT_MARK = "⚠"  # a table row holding a cell that starts with it is shaded as saturated
MD_LINE_MAX = 400  # characters; a table row cannot break, so tables keep their cells short

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}tr.sat td{background:#fff1ef}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:.9em;color:#444}
p.headline{font-size:1.05em;background:#f5f8ff;border-left:4px solid #1f77b4;padding:.4em .8em}
.meta{color:#666;font-size:.85em}
.row{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start}.row>div{flex:1 1 360px;min-width:0}
.row>div:first-child{flex:0 1 600px}.row figure{margin:0}.row p{font-size:.85em;color:#444}
.row td{white-space:nowrap}.row td:last-child{white-space:normal}
ul.findings{margin:.4em 0 .8em;padding-left:1.2em}ul.findings li{margin:.15em 0}
"""


@dataclass
class SavedFigure:
    stem: str
    caption: str
    paths: list[Path]


# A line starting with one of these would open a block (list item, heading, quote, table, ...) in
# markdown; a soft break never puts one first.
_BLOCK_START = re.compile(r"([-+*>#|=`~<]|\d+[.)])(\s|$)|[-=_*`~]{3}")


def wrap_md(text: str, width: int = MD_LINE_MAX, indent: str = "") -> str:
    """``text`` as lines of at most ``width`` characters: whole when it fits, else broken after
    sentences, and a sentence still too long between words; each line after the first starts with
    ``indent``.  A word longer than a line stays whole."""
    if len(text) <= width or "\n" in text:
        return text
    words = text.split(" ")
    lines: list[str] = []
    cur = ""
    for w in words:
        joined = f"{cur} {w}" if cur else w
        sentence_end = bool(re.search(r"[.!?][)*]*$", cur)) and len(cur) > width // 4
        fits = len((indent if lines else "") + joined) <= width
        if cur and (not fits or sentence_end) and not _BLOCK_START.match(w):
            lines.append(cur)
            cur = w
        else:
            cur = joined
    lines.append(cur)
    return ("\n" + indent).join(x.rstrip() for x in lines)


def _md_cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    if df is None or df.empty:
        return "(none)\n"
    lines = ["| " + " | ".join(_md_cell(c) for c in df.columns) + " |",
             "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def html_table(df: pd.DataFrame) -> str:
    if df is None or df.empty:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        sat = any(str(v).startswith(SAT_MARK) for v in row)
        cls = ' class="sat"' if sat else ""
        # A code list such as "open+behind+full" may break after each "+".
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(v)).replace('+', '+<wbr>')}</td>" for v in row)
                    + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(fig: SavedFigure, out_dir: Path) -> tuple[str, str]:
    png = next(p for p in fig.paths if p.suffix == ".png")
    rel = png.relative_to(out_dir).as_posix()
    svg = [p for p in fig.paths if p.suffix == ".svg"]
    svg_txt = f" ([SVG]({svg[0].relative_to(out_dir).as_posix()}))" if svg else ""
    md = f"![{fig.caption.split('.')[0]}]({rel})\n\n" + wrap_md(f"*{fig.caption}*{svg_txt}") + "\n"
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    page = (f"<figure id='{fig.stem}'><img alt='{html.escape(fig.caption, quote=True)}' "
            f"src='data:image/png;base64,{data}'><figcaption>{html.escape(fig.caption)}</figcaption></figure>")
    return md, page


def _block(b: tuple, out_dir: Path) -> tuple[str, str]:
    kind = b[0]
    if kind == "h2":
        return f"\n## {b[1]}\n", f"<h2>{html.escape(b[1])}</h2>"
    if kind in ("p", "headline", "meta"):
        bold = "**" if kind == "headline" else ""
        cls = f" class='{kind}'" if kind != "p" else ""
        return wrap_md(f"{bold}{b[1]}{bold}") + "\n", f"<p{cls}>{html.escape(b[1])}</p>"
    if kind == "list":  # ("list", [text], class)
        cls = f" class='{html.escape(b[2], quote=True)}'" if len(b) > 2 else ""
        return ("\n".join(wrap_md(f"- {x}", indent="  ") for x in b[1]) + "\n",
                f"<ul{cls}>" + "".join(f"<li>{html.escape(x)}</li>" for x in b[1]) + "</ul>")
    if kind == "row":
        parts = [[_block(x, out_dir) for x in col] for col in b[1]]
        md = "\n".join(m for col in parts for m, _ in col)
        ident = f" id='{html.escape(b[2], quote=True)}'" if len(b) > 2 else ""
        return md, f"<div class='row'{ident}>" + "".join(
            "<div>" + "".join(h for _, h in col) + "</div>" for col in parts) + "</div>"
    if kind == "table":
        return md_table(b[1]), html_table(b[1])
    if kind == "fig":
        return _figure(b[1], out_dir)
    raise ValueError(f"unknown block kind {kind!r}")


def render(blocks: list[tuple], title: str, out_dir: Path) -> tuple[str, str]:
    """Blocks -> (markdown, self-contained html).  Figures: md links plots/, html embeds the PNG."""
    md = [f"# {title}\n"]
    hb = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
          f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    for b in blocks:
        m, h = _block(b, out_dir)
        md.append(m)
        hb.append(h)
    hb.append("</body></html>\n")
    return "\n".join(md), "".join(hb)


def write_report(blocks: list[tuple], title: str, out_dir: Path) -> Path:
    """Render ``blocks`` and write report.md and report.html into ``out_dir``.  Returns report.html's path."""
    md, page = render(blocks, title, out_dir)
    atomic_write_text(out_dir / REPORT_MD, md)
    atomic_write_text(out_dir / REPORT_HTML, page)
    return out_dir / REPORT_HTML
