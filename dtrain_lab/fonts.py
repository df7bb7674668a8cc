"""Chinese glyphs for plots: the CJK font that ships with the course (``noto-cjk-sans-otc``, Google's
Noto Sans CJK, SIL Open Font License 1.1, from PyPI), else a system one. Asked through
:mod:`dtrain_lab.caps` (probe ``cjk_font``); :mod:`dtrain_lab.viz` configures matplotlib with it."""
from __future__ import annotations

PACKAGED_FONT = "Noto Sans CJK SC"
CJK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN",
    "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB", "Heiti SC",
    "STHeiti", "Microsoft YaHei", "SimHei", "Arial Unicode MS",
)


def _register_packaged_font() -> str | None:
    """Register the Noto Sans CJK collection (.ttc) that ``noto-cjk-sans-otc`` installs; its name, or
    None where the package is missing or this matplotlib cannot read it."""
    try:
        import noto_cjk_sans_otc
        from matplotlib import font_manager

        font_manager.fontManager.addfont(str(noto_cjk_sans_otc.FONT_PATH))
    except Exception:  # noqa: BLE001 - any failure means: fall back to the system's fonts
        return None
    return PACKAGED_FONT if PACKAGED_FONT in {f.name for f in font_manager.fontManager.ttflist} else None


def find_cjk_font(rescan: bool = True) -> str | None:
    """A CJK font matplotlib knows: the packaged Noto Sans CJK SC first, then the system's."""
    from matplotlib import font_manager

    def scan() -> str | None:
        names = {f.name for f in font_manager.fontManager.ttflist}
        return next((n for n in CJK_FONTS if n in names), None)

    found = _register_packaged_font() or scan()
    if found is None and rescan:
        # matplotlib caches its font list; a font installed after the cache was built is unseen
        font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
        found = scan()
    return found
