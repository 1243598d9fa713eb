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
fonts (glyph outlines with a Unicode map): `pdffonts` lists them without a
name, every one embedded, and the text layer holds the Chinese characters.
"""
from __future__ import annotations

import os
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


def pdf_text(pdf_path: Path, first_page: int = 1, last_page: int | None = None) -> str:
    """The PDF's text layer (pdftotext), for checking that the Chinese text is text and not boxes."""
    command = [_poppler("pdftotext"), "-f", str(first_page)]
    if last_page is not None:
        command += ["-l", str(last_page)]
    return subprocess.run(command + [str(pdf_path), "-"], capture_output=True, text=True, check=True).stdout


def pdf_fonts(pdf_path: Path) -> list[dict[str, str]]:
    """One row per font in the PDF (pdffonts): name, type, and whether it is embedded."""
    out = subprocess.run([_poppler("pdffonts"), str(pdf_path)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines()[2:]:          # a header line and a rule
        parts = line.split()
        if len(parts) >= 7:
            # name type [encoding words...] emb sub uni object ID: read the flags from the right.
            rows.append({"name": parts[0], "emb": parts[-5], "sub": parts[-4], "uni": parts[-3]})
    return rows
