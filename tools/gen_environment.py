"""Write environment.yml (for conda users) from pyproject.toml, the one source of the dependencies.

    python tools/gen_environment.py          # rewrite environment.yml
    python tools/gen_environment.py --check  # exit 1 if environment.yml is out of date (a test runs this)
"""
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def render() -> str:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = meta["requires-python"].replace(">=", "")
    lines = [
        "# Generated from pyproject.toml by tools/gen_environment.py: edit pyproject.toml, then run it.",
        "# conda env create -f environment.yml && conda activate dtrain-lab && jupyter lab lessons/",
        "name: dtrain-lab",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - python>={floor}",
        "  - pip",
        "  - pip:",
    ]
    for dep in meta["dependencies"] + meta["optional-dependencies"]["dev"]:
        lines.append(f'      - "{dep}"')
    lines.append('      - "-e ."')
    return "\n".join(lines) + "\n"


def main() -> int:
    path = ROOT / "environment.yml"
    text = render()
    if "--check" in sys.argv:
        if not path.exists() or path.read_text() != text:
            print("environment.yml is out of date: run python tools/gen_environment.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
