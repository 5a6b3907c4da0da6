"""The picture `ttbundle demo --vision` sends: drawn here, so the demo needs no file.

Simple shapes in plain colours on white (a red circle, a green triangle, a blue square),
the kind of picture a trained vision-language model names at a glance. Deterministic:
the same pixels every time, so a test can hand transformers the very image the server got.
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image

DESCRIPTION = "a red circle, a green triangle and a blue square on white"
SIZE = (168, 112)  # width, height: 12 x 8 patches of 14 pixels, 24 image tokens


def draw_picture() -> Image:
    """The demo's picture (RGB, `SIZE`)."""
    from PIL import Image, ImageDraw

    width, height = SIZE
    picture = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(picture)
    draw.ellipse((8, 28, 56, 76), fill=(220, 30, 30))
    draw.polygon([(84, 20), (60, 84), (108, 84)], fill=(30, 160, 60))
    draw.rectangle((116, 32, 160, 76), fill=(30, 60, 220))
    draw.line((0, height - 12, width, height - 12), fill=(90, 90, 90), width=2)
    return picture


def png_bytes(picture: Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


def data_url(picture: Image) -> str:
    """`data:image/png;base64,...`: how the OpenAI chat API takes an inline image."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(picture)).decode("ascii")
