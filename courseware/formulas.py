"""Formulas typeset offline with KaTeX when the pages are built, so the PDFs show math, not TeX source.

The tutorials and handouts write formulas as TeX between `$...$` (inline) and
`$$...$$` (display), as Jupyter does. nbconvert's pages would hand them to
MathJax from a CDN, which a print with the network blocked never loads
(courseware/pdf.py), so the lecture formulas printed as plain text. Here every
formula of a page is cut out of the Markdown before it is converted (a
placeholder takes its place, so the Markdown parser cannot touch the TeX),
typeset by KaTeX, the npm package pinned in courseware/katex/package.json,
run by Node.js, and put back as HTML. The page carries KaTeX's style sheet
with its fonts inlined, so it needs nothing from outside.

Why KaTeX through Node rather than a Python renderer: KaTeX is the renderer
Jupyter users know, its output needs no script in the page, and it fails on a
formula it cannot typeset instead of printing it half-done. The price is
Node.js on the build machine (Debian's `nodejs`, on the course's machines
already) and `npm ci --prefix courseware/katex` once (README's setup, .ci/run).
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

KATEX_DIR = Path(__file__).resolve().parent / "katex"
INSTALL_HINT = "install it with: npm ci --prefix courseware/katex (README, 'Setup'; needs Node.js)"
_CODE = re.compile(r"(^```.*?^```[ \t]*$)|(`+)(.+?)\2", re.S | re.M)     # fenced blocks, code spans
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])")
_PLACEHOLDER = "ILMATH{:05d}X"
_RESTORE = re.compile(r"ILMATH(\d{5})X")


class MathToolMissing(RuntimeError):
    """Node.js or the KaTeX package is not installed; the message says how to install it."""


def cut_math(text: str, formulas: list[tuple[str, bool]]) -> str:
    """`text` with each formula outside code replaced by a placeholder; the formulas are appended to `formulas`."""
    def take(display: bool):
        def replace(match: re.Match) -> str:
            formulas.append((match.group(1).strip(), display))
            return _PLACEHOLDER.format(len(formulas) - 1)
        return replace

    def cut(piece: str) -> str:
        return _INLINE.sub(take(False), _DISPLAY.sub(take(True), piece))

    pieces, position = [], 0
    for match in _CODE.finditer(text):          # code is kept as written: `$PATH`, `f"${x}"`
        pieces += [cut(text[position:match.start()]), match.group(0)]
        position = match.end()
    return "".join(pieces) + cut(text[position:])


def node() -> str:
    found = shutil.which("node") or shutil.which("nodejs")
    if found is None or not (KATEX_DIR / "node_modules" / "katex").is_dir():
        raise MathToolMissing("the pages have formulas, and KaTeX cannot typeset them: "
                              + ("Node.js is missing; " if found is None else "courseware/katex has no node_modules; ")
                              + INSTALL_HINT)
    return found


def typeset(formulas: list[tuple[str, bool]]) -> list[str]:
    """KaTeX's HTML for each (TeX, display?) in one Node process; an invalid formula raises ValueError."""
    if not formulas:
        return []
    result = subprocess.run([node(), str(KATEX_DIR / "render.js")], capture_output=True, text=True, check=False,
                            input=json.dumps([{"tex": tex, "display": display} for tex, display in formulas]))
    if result.returncode != 0:
        raise ValueError(f"KaTeX could not typeset a formula: {result.stderr.strip()[-800:]}")
    return json.loads(result.stdout)


def put_back(html: str, rendered: list[str]) -> str:
    """The page with each placeholder replaced by its typeset formula."""
    return _RESTORE.sub(lambda m: rendered[int(m.group(1))], html)


@lru_cache(maxsize=1)
def stylesheet() -> str:
    """KaTeX's CSS with its woff2 fonts inlined as data URLs (the print has no network)."""
    dist = KATEX_DIR / "node_modules" / "katex" / "dist"
    css = (dist / "katex.min.css").read_text(encoding="utf-8")

    def inline(match: re.Match) -> str:
        data = base64.b64encode((dist / match.group(1)).read_bytes()).decode()
        return f"url(data:font/woff2;base64,{data}) format(\"woff2\")"

    css = re.sub(r"url\((fonts/[^)]+\.woff2)\) format\(\"woff2\"\)", inline, css)
    # the woff and ttf copies are not needed once woff2 is inline
    return re.sub(r",url\(fonts/[^)]+\) format\(\"(woff|truetype)\"\)", "", css)
