"""Figures a reader can play with in the static book, without a kernel.

A notebook's ipywidgets need a running Python to redraw, so the rendered page shows only their
default view. A flipbook instead draws every combination of a few slider values ahead of time, and a
few lines of JavaScript inside the output show the one the sliders select. A hover figure is an
inline SVG whose data points carry their values as SVG tooltips (no script at all). Nothing is
fetched from a CDN, so the page works offline, in the built site and in any notebook front-end.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import re
import uuid

import matplotlib.pyplot as plt


def frame_key(values) -> str:
    """The key of one combination of slider values, as the page's script builds it."""
    return "|".join(str(v) for v in values)


def flipbook(draw, sliders: dict[str, list], default: dict | None = None, dpi: int = 72) -> str:
    """HTML of a figure with one range slider per entry of ``sliders`` (name -> the values it steps
    through). ``draw(**values)`` returns a matplotlib figure for one combination; every combination
    is drawn here, so keep the product of the lists small (each frame is a PNG in the page)."""
    names = list(sliders)
    frames = {}
    for values in itertools.product(*sliders.values()):
        fig = draw(**dict(zip(names, values)))
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
        plt.close(fig)
        frames[frame_key(values)] = base64.b64encode(buffer.getvalue()).decode()
    start = {name: (default or {}).get(name, options[0]) for name, options in sliders.items()}
    uid = f"flipbook-{uuid.uuid4().hex[:8]}"
    controls = "".join(
        f'<label style="margin-right:1.5em">{name} <input type="range" data-name="{name}" min="0" '
        f'max="{len(options) - 1}" step="1" value="{options.index(start[name])}"> <output>{start[name]}</output></label>'
        for name, options in sliders.items())
    first = frames[frame_key(start.values())]
    # The script only looks a frame up: every number in the picture was computed in Python.
    script = (f"(function(){{const root=document.getElementById('{uid}');"
              f"const names={json.dumps(names)},options={json.dumps(sliders)},frames={json.dumps(frames)};"
              "const img=root.querySelector('img');"
              "function show(){const chosen=names.map(n=>{const input=root.querySelector(`input[data-name=\"${n}\"]`);"
              "const value=options[n][+input.value];input.nextElementSibling.textContent=value;return value;});"
              "img.src='data:image/png;base64,'+frames[chosen.join('|')];}"
              "root.querySelectorAll('input').forEach(i=>i.addEventListener('input',show));})();")
    return (f'<div class="flipbook" id="{uid}"><div>{controls}</div>'
            f'<img style="max-width:100%" alt="figure for the chosen slider values" src="data:image/png;base64,{first}">'
            f"<script>{script}</script></div>")


def hover(fig) -> str:
    """HTML of ``fig`` as an inline SVG in which every point of every line shows, under the pointer,
    its line's label and its x and y values with the axes' labels. A line whose label starts with an
    underscore (hidden from the legend) is named by the rest of it."""
    tips = []
    for ax in fig.axes:
        for line in list(ax.get_lines()):
            name = line.get_label().lstrip("_")
            name = "" if name.startswith("child") else f"{name}: "
            for x, y in zip(*line.get_data()):
                # One invisible marker per point, in its own SVG group (gid) to hang the tooltip on.
                ax.plot([x], [y], "o", ms=9, alpha=0, gid=f"tip-{len(tips)}")
                tips.append(f"{name}{ax.get_xlabel()} = {x:,g}; {ax.get_ylabel()} = {y:,.4g}")
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):  # text as text: a smaller page
        fig.savefig(buffer, format="svg")
    plt.close(fig)
    svg = buffer.getvalue()[buffer.getvalue().index("<svg"):]
    svg = re.sub(r'<g id="tip-(\d+)">', lambda m: f"{m[0]}<title>{html.escape(tips[int(m[1])])}</title>", svg)
    # Scale down to the column like an image (the SVG has a viewBox), rather than scroll sideways.
    svg = svg.replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)
    return f'<div class="hover-figure">{svg}</div>'
