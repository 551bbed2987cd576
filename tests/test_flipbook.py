"""The static page's slider figures (one frame per combination, each the drawing of its values) and
hover figures (a tooltip per point with its values); nothing fetched from outside the page."""

import base64
import io
import json
import re

import matplotlib
import matplotlib.pyplot as plt

from attn_gym_lite.book.flipbook import flipbook, hover

matplotlib.use("Agg")


def draw(a, b):
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.bar([0], [a * 10 + b])
    return fig


def test_every_combination_is_its_own_drawing_and_the_page_is_self_contained():
    html = flipbook(draw, {"a": [1, 2, 3], "b": [0, 5]}, default={"a": 2, "b": 5})
    frames = json.loads(re.search(r"frames=(\{.*?\});", html).group(1))
    assert sorted(frames) == sorted(f"{a}|{b}" for a in (1, 2, 3) for b in (0, 5))
    for key, png in frames.items():  # each frame is exactly what draw() gives for its values
        buffer = io.BytesIO()
        draw(*map(int, key.split("|"))).savefig(buffer, format="png", dpi=72, metadata={"Software": None})
        assert base64.b64decode(png) == buffer.getvalue()
    assert f'src="data:image/png;base64,{frames["2|5"]}"' in html  # the default shown first, sliders on it
    assert re.findall(r'data-name="(\w)" min="0" max="(\d)" step="1" value="(\d)"', html) == [("a", "2", "1"), ("b", "1", "1")]
    assert not re.search(r"(src|href)=\"(https?:)?//", html) and "<script src" not in html


def test_hover_names_every_point_with_its_values():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [30, 40], label="flat")
    ax.plot([1, 2], [5, 6], label="_flat (exact)")
    ax.set(xlabel="L", ylabel="µs")
    assert re.findall(r"<title>(.*?)</title>", hover(fig)) == [
        "flat: L = 1; µs = 30", "flat: L = 2; µs = 40", "flat (exact): L = 1; µs = 5", "flat (exact): L = 2; µs = 6"]
