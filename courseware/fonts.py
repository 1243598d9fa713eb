"""The page's Chinese font, embedded as TrueType so a PDF's text layer reads back as written.

Chromium's PDF writer embeds a CFF-flavoured OpenType font, which Noto Sans
CJK is, as Type 3 fonts: each glyph a drawing. Their metrics do not match the
TrueType Latin fonts beside them, so a text extractor (pdftotext, a reader's
copy and paste) splits a mixed Chinese/English line into pieces on different
lines: "Tutorial 06 · 推理系统架构：control plane、data plane" came out as four
lines in another order. A TrueType font is embedded as a CID TrueType font with
its real metrics, and the line reads back as written.

So every page carries its own copy of the Noto CJK faces it uses, cut down to
the characters on that page (fontTools' subsetter) and converted from cubic CFF
outlines to quadratic TrueType ones (fontTools' cu2qu), as `@font-face` rules
with data URLs. The faces come from the system's fonts-noto-cjk (fontconfig
finds them), the same package the PDF build already needs; a page is about
0.25 MB larger for each face.
"""
from __future__ import annotations

import base64
import html
import io
import shutil
import subprocess
from functools import lru_cache

from courseware.pdf import PdfToolMissing, _install_hint, FONT_PACKAGE

# (family name the page uses, CSS weight, fontconfig pattern of the system face it is made from)
FACES = (("InferLab Sans", "normal", "Noto Sans CJK SC:style=Regular"),
         ("InferLab Sans", "bold", "Noto Sans CJK SC:style=Bold"),
         ("InferLab Mono", "normal", "Noto Sans Mono CJK SC:style=Regular"),
         ("InferLab Mono", "bold", "Noto Sans Mono CJK SC:style=Bold"))


def locate(pattern: str) -> tuple[str, int]:
    """(file, index in its collection) of the face fontconfig matches exactly, or PdfToolMissing."""
    if shutil.which("fc-match") is None:
        raise PdfToolMissing("fontconfig's fc-match is missing; " + _install_hint(FONT_PACKAGE))
    family = pattern.split(":")[0]
    out = subprocess.run(["fc-match", "-f", "%{family}\n%{file}\n%{index}", pattern],
                         capture_output=True, text=True, check=False).stdout.splitlines()
    if len(out) < 3 or family not in out[0].split(","):
        raise PdfToolMissing(f"no font {pattern!r} for the PDFs' Chinese text; " + _install_hint(FONT_PACKAGE))
    return out[1], int(out[2])


def _cff_to_truetype(font) -> None:
    """Replace the font's CFF outlines by TrueType ones, in place (what fontTools' otf2ttf snippet does)."""
    from fontTools.pens.cu2quPen import Cu2QuPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen
    from fontTools.ttLib import newTable
    order = font.getGlyphOrder()
    glyphs = font.getGlyphSet()
    glyf = newTable("glyf")
    glyf.glyphOrder, glyf.glyphs = order, {}
    for name in order:
        pen = TTGlyphPen(glyphs)
        glyphs[name].draw(Cu2QuPen(pen, max_err=1.0, reverse_direction=True))
        glyf.glyphs[name] = pen.glyph()
    font["loca"], font["glyf"] = newTable("loca"), glyf
    maxp = newTable("maxp")
    maxp.tableVersion = 0x00010000
    for field in ("maxZones", "maxTwilightPoints", "maxStorage", "maxFunctionDefs", "maxInstructionDefs",
                  "maxStackElements", "maxSizeOfInstructions", "maxComponentElements"):
        setattr(maxp, field, 1 if field == "maxZones" else 0)
    font["maxp"] = maxp
    for table in ("CFF ", "VORG"):
        if table in font:
            del font[table]
    font["head"].glyphDataFormat = 0
    post = font["post"]
    post.formatType, post.extraNames, post.mapping = 2.0, [], {}
    font.sfntVersion = "\x00\x01\x00\x00"


@lru_cache(maxsize=64)
def truetype_subset(path: str, index: int, characters: str) -> bytes:
    """The face at (path, index) with only `characters` (and the layout features they use), as TrueType."""
    from fontTools import subset
    from fontTools.ttLib import TTFont
    font = TTFont(path, fontNumber=index)
    options = subset.Options()
    options.layout_features, options.name_IDs, options.notdef_outline = ["*"], ["*"], True
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=characters)
    subsetter.subset(font)
    if "CFF " in font:
        _cff_to_truetype(font)
    buffer = io.BytesIO()
    font.save(buffer)
    return buffer.getvalue()


def font_faces(page: str) -> str:
    """`@font-face` rules with the faces of FACES cut down to the characters of `page` (an HTML text)."""
    characters = "".join(sorted(set(html.unescape(page)) - set("\n\r\t")))
    rules = []
    for family, weight, pattern in FACES:
        data = base64.b64encode(truetype_subset(*locate(pattern), characters)).decode()
        rules.append(f"@font-face {{ font-family: \"{family}\"; font-weight: {weight}; "
                     f"src: url(data:font/ttf;base64,{data}) format(\"truetype\"); }}")
    return "\n".join(rules)
