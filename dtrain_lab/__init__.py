"""dtrain-lab: the library behind the distributed-training course.

``import dtrain_lab`` is cheap (no torch import): the notebook's setup cell and the launcher stay
fast, and torch is imported by the modules that need it.
"""
from .i18n import LabError, get_lang, set_lang
from .launch import LaunchResult, launch

__version__ = "0.1.0"
__all__ = ["launch", "LaunchResult", "set_lang", "get_lang", "LabError", "show", "__version__"]


def show(obj) -> None:
    """Show the source of a library object with syntax colouring (used by the lessons)."""
    from .viz import show as _show

    _show(obj)
