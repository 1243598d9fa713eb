"""HTML to PDF with headless Chromium, and the checks that the result can be read.

Why Chromium: the tutorial pages are nbconvert's HTML (syntax highlighting,
embedded figures, tables); printing that same page keeps the HTML and the PDF
identical, where a LaTeX route would need a second template and a CJK TeX
setup (several hundred MB more). The price is a browser on the build machine:
the Debian package `chromium`, and `fonts-noto-cjk` for the Chinese text, both
installed by README's setup and by .ci/run.

The browser runs with every host name resolving to nothing, so a page that
tried to fetch a script or font from the network would print without it
rather than depend on it (the pages are built to need nothing from outside).
A missing browser or CJK font is an error that names the package: without
the font Chromium prints every Chinese character as a box and says nothing.

Noto CJK is an OpenType/CFF font, which Chromium's PDF writer embeds as Type 3
fonts, whose metrics split a mixed Chinese/English line when the text is copied
out; so each page carries the faces it uses as TrueType (courseware/fonts.py),
and every font in a PDF is a CID TrueType font (tests/courseware/test_build_pdf.py).

Figures are SVG with their labels kept as text (courseware/build.py), so the
printed size of every label can be read back (`figure_text`).
"""
from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER_PACKAGE = "chromium"
FONT_PACKAGE = "fonts-noto-cjk"
POPPLER_PACKAGE = "poppler-utils"
PRINT_TIMEOUT_S = 120


class PdfToolMissing(RuntimeError):
    """A system package the PDF build needs is not installed; the message names it."""


def _install_hint(package: str) -> str:
    return f"install it with: apt-get install -y --no-install-recommends {package} (README, 'Setup')"


def find_browser() -> str:
    """Path of a Chromium-family browser; INFERLAB_CHROMIUM overrides the search."""
    override = os.environ.get("INFERLAB_CHROMIUM")
    candidates = [override] if override else list(BROWSERS)
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise PdfToolMissing(f"no Chromium found (tried {', '.join(candidates)}) to print PDFs; "
                         + _install_hint(BROWSER_PACKAGE))


def cjk_fonts() -> list[str]:
    """Font families fontconfig knows for Simplified Chinese (empty when none, or no fontconfig)."""
    if shutil.which("fc-list") is None:
        return []
    listing = subprocess.run(["fc-list", ":lang=zh-cn", "family"], capture_output=True, text=True, check=False)
    return sorted({line.split(",")[0].strip() for line in listing.stdout.splitlines() if line.strip()})


def require_cjk_font() -> str:
    """The first CJK family found; an error naming the font package when there is none."""
    fonts = cjk_fonts()
    if not fonts:
        raise PdfToolMissing("no Chinese font installed: every Chinese character would print as a box; "
                             + _install_hint(FONT_PACKAGE))
    return fonts[0]


def html_to_pdf(html_path: Path, pdf_path: Path, browser: str | None = None) -> Path:
    """Print one local HTML file to an A4 PDF (page size and margins come from the page's @page rule)."""
    browser = browser or find_browser()
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="inferlab-chromium-") as profile:
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--disable-extensions", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                   "--host-resolver-rules=MAP * ~NOTFOUND", "--no-pdf-header-footer",
                   f"--print-to-pdf={pdf_path.resolve()}", html_path.resolve().as_uri()]
        result = subprocess.run(command, capture_output=True, text=True, timeout=PRINT_TIMEOUT_S, check=False)
    if result.returncode != 0 or not pdf_path.is_file() or pdf_path.stat().st_size == 0:
        raise RuntimeError(f"{browser} could not print {html_path} (exit {result.returncode}): "
                           f"{result.stderr.strip()[-1500:]}")
    return pdf_path


# --------------------------------------------------------------------------- reading a PDF back


def _poppler(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise PdfToolMissing(f"{tool} is missing; " + _install_hint(POPPLER_PACKAGE))
    return found


def pdf_text(pdf_path: Path, first_page: int = 1, last_page: int | None = None, layout: bool = False) -> str:
    """The PDF's text layer (pdftotext), for checking that the Chinese text is text and not boxes.

    layout=True keeps each printed line whole (pdftotext -layout): without it, pdftotext splits a line
    at a wide gap into blocks, as it does a code line at the two spaces before its comment."""
    command = [_poppler("pdftotext"), "-f", str(first_page)] + (["-layout"] if layout else [])
    if last_page is not None:
        command += ["-l", str(last_page)]
    return subprocess.run(command + [str(pdf_path), "-"], capture_output=True, text=True, check=True).stdout


def pdf_fonts(pdf_path: Path) -> list[dict[str, str]]:
    """One row per font in the PDF (pdffonts): name, type ("Type 3", "CID TrueType"...), and whether it is embedded."""
    out = subprocess.run([_poppler("pdffonts"), str(pdf_path)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    # The rule under the header gives each column's width: "---- ----- ..."
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])] if len(lines) > 1 else []
    rows = []
    for line in lines[2:]:
        cells = [line[a:b + 1].strip() for a, b in spans]
        if len(cells) >= 6:
            rows.append({"name": cells[0], "type": cells[1], "emb": cells[3], "sub": cells[4], "uni": cells[5]})
    return rows


def text_runs(pdf_path: Path) -> list[tuple[str, int, str]]:
    """(text, font size in points rounded to an integer, font name) for each run of text, as printed
    (poppler's pdftohtml -xml at zoom 1)."""
    out = subprocess.run([_poppler("pdftohtml"), "-xml", "-i", "-stdout", "-q", "-zoom", "1", str(pdf_path)],
                         capture_output=True, text=True, check=True).stdout
    fonts = {m["id"]: (int(m["size"]), m["family"])
             for m in re.finditer(r'<fontspec id="(?P<id>\d+)" size="(?P<size>-?\d+)" family="(?P<family>[^"]*)"', out)}
    return [(html.unescape(re.sub(r"<[^>]+>", "", m["text"])), *fonts[m["font"]])
            for m in re.finditer(r'<text [^>]*font="(?P<font>\d+)"[^>]*>(?P<text>.*?)</text>', out)]


# matplotlib's labels are DejaVu Sans (courseware/templates/matplotlibrc); the page's own text is not.
FIGURE_FONT = re.compile(r"DejaVuSans(?!Mono)")


def figure_text(pdf_path: Path) -> list[tuple[str, int]]:
    """(text, printed size in points) of every label of every figure in the PDF."""
    return [(text, size) for text, size, family in text_runs(pdf_path) if FIGURE_FONT.search(family)]
