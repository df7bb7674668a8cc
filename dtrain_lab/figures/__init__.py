"""Pictures of mechanisms, drawn from what the ranks of a run actually did.

Each figure is a function of **recorded** data (the sends of a ring all-reduce, the shards each rank
held, the tokens each rank sent) and of the language, never of hand-drawn data. The data are plain
JSON (what :func:`dtrain_lab.jobs.runtime.report` carries), so a notebook stores them next to the
picture and a test redraws the picture from them (``tests/test_figures.py``).

A stored figure must be the same on every machine, in every run and under every capability probe:

* SVG, with a fixed ``svg.hashsalt``, no date or creator in its metadata, and every glyph drawn as a
  path (``svg.fonttype = "path"``): the file holds no font, no time and no random id;
* matplotlib's default style, whatever a lesson or the learner's ``matplotlibrc`` changed;
* only the course's own font, Noto Sans CJK SC from the ``noto-cjk-sans-otc`` package, for every
  glyph, Latin and Chinese alike: never a system font, and not asked through the ``cjk_font`` probe
  (a machine without a Chinese system font draws the same picture; :mod:`dtrain_lab.viz` is the
  fallback path for live plots).

:func:`show` displays a figure as ``image/svg+xml`` (GitHub and nbviewer show it without running
anything), with its name and inputs in the output's metadata.

    svg = figures.svg("ring_all_reduce", inputs, "zh")
"""
from __future__ import annotations

import functools
import io
import os

from dtrain_lab.fonts import PACKAGED_FONT, _register_packaged_font
from dtrain_lab.i18n import LabError, get_lang, tr

HASHSALT = "dtrain-lab"
METADATA_KEY = "dtrain_lab_figure"   # where a notebook output keeps the figure's name and inputs


def _drawers() -> dict:
    from dtrain_lab.figures import context, ring, tensor, zero
    from dtrain_lab.figures import buckets, hang, paths, rendezvous, restarts

    return {"ring_all_reduce": ring.draw, "zero_shards": zero.draw, "megatron_mlp": tensor.draw,
            "ring_attention": context.draw_ring, "moe_dispatch": context.draw_dispatch,
            "hang_waits": hang.draw, "ddp_buckets": buckets.draw,
            "restarts": restarts.draw, "rendezvous": rendezvous.draw,
            "nccl_paths": paths.draw}


NAMES = ("ring_all_reduce", "zero_shards", "megatron_mlp", "ring_attention", "moe_dispatch",
         "hang_waits", "ddp_buckets", "restarts", "rendezvous", "nccl_paths")


@functools.lru_cache(maxsize=1)
def font() -> str:
    """The packaged font's family name, checked to resolve to the packaged file and nothing else."""
    from matplotlib import font_manager

    name = _register_packaged_font()
    if name is None:
        raise LabError("fig_no_font")
    import noto_cjk_sans_otc

    found = font_manager.findfont(font_manager.FontProperties(family=[name]), fallback_to_default=False)
    if not os.path.samefile(found, noto_cjk_sans_otc.FONT_PATH):
        raise LabError("fig_font_elsewhere", name=PACKAGED_FONT, path=found)
    return name


def style() -> dict:
    """The rcParams every figure is drawn with (on top of matplotlib's defaults)."""
    return {"svg.hashsalt": HASHSALT, "svg.fonttype": "path", "font.family": [font()],
            "axes.unicode_minus": False, "font.size": 9}


def render(name: str, inputs: dict, lang: str):
    """The figure ``name`` drawn from ``inputs`` with labels in ``lang``: a matplotlib ``Figure``
    (not a pyplot one: a notebook does not show it by itself). Draw and save it inside :func:`styled`."""
    drawers = _drawers()
    if name not in drawers:
        raise LabError("fig_unknown", name=name, known=", ".join(NAMES))
    return drawers[name](inputs, lang)


class styled:
    """``with styled():`` matplotlib's default style plus :func:`style`, restored afterwards."""

    def __enter__(self):
        import matplotlib

        self._ctx = matplotlib.rc_context()
        self._ctx.__enter__()
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(style())
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def _drawn(name: str, inputs: dict, lang: str | None, formats: tuple[str, ...]) -> dict[str, str]:
    """Figure ``name`` drawn once and saved in each of ``formats`` ("svg": its text; "png": base64)."""
    import base64

    lang = lang or get_lang()
    out = {}
    with styled():
        fig = render(name, inputs, lang)
        for fmt in formats:        # the SVG first: it is the reference, saved from a fresh drawing
            if fmt == "svg":
                buf = io.StringIO()
                fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
                out[fmt] = buf.getvalue()
            else:
                raw = io.BytesIO()
                fig.savefig(raw, format="png", dpi=100, metadata={"Software": None})
                out[fmt] = base64.b64encode(raw.getvalue()).decode()
    return out


def svg(name: str, inputs: dict, lang: str | None = None) -> str:
    """The SVG text of figure ``name``: the same bytes for the same inputs and language, anywhere."""
    return _drawn(name, inputs, lang, ("svg",))["svg"]


def title(name: str, inputs: dict, lang: str | None = None) -> str:
    """One line naming the figure (the output's text/plain, for a reader without images)."""
    return tr("fig_plain", lang, name=name, world_size=inputs.get("world_size", "?"))


def png(name: str, inputs: dict, lang: str | None = None) -> str:
    """The figure as a base64 PNG (no metadata): what JupyterLab shows in a notebook it does not trust.

    JupyterLab renders SVG only in trusted outputs (an SVG can carry script), and a freshly cloned
    notebook's stored outputs are untrusted: without this copy a learner opening a lesson would see
    only the figure's one-line title. GitHub and nbviewer show the SVG. The SVG is the reference
    (``tests/test_figures.py`` compares it); this copy is drawn from the same inputs."""
    return _drawn(name, inputs, lang, ("png",))["png"]


def bundle(name: str, inputs: dict, lang: str | None = None) -> dict:
    """The output's data: SVG, its PNG copy and the one-line title."""
    drawn = _drawn(name, inputs, lang, ("svg", "png"))
    return {"image/svg+xml": drawn["svg"], "image/png": drawn["png"], "text/plain": title(name, inputs, lang)}


def show(name: str, inputs: dict) -> None:
    """Display figure ``name`` in the learner's language as ``image/svg+xml`` (with a PNG copy for an
    untrusted notebook, :func:`png`), its inputs in the output's metadata (what
    ``tests/test_figures.py`` redraws it from)."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(bundle(name, inputs), raw=True,
                     metadata={METADATA_KEY: {"name": name, "inputs": inputs}})
            return
    except ImportError:
        pass
    svg(name, inputs)      # drawn all the same: a figure that cannot be drawn fails here too
    print(title(name, inputs))
