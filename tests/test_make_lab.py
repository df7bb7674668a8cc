"""`make lab` (the README's first command) really starts JupyterLab with the course's kernel, on the course."""
import json
import urllib.request

import pytest

from lab_server import TOKEN, get, make_lab


@pytest.mark.timeout(120)
def test_make_lab_serves_the_course():
    with make_lab() as url:
        specs = get(f"{url}/api/kernelspecs?token={TOKEN}")
        assert "python3" in specs
        listing = get(f"{url}/api/contents/lessons/en?token={TOKEN}")
        assert "00_torchrun_process_group.ipynb" in listing
        # the landing page is the course's start page, not the Launcher at the repo root
        with urllib.request.urlopen(f"{url}/?token={TOKEN}", timeout=20) as resp:
            assert resp.geturl().split("?")[0].endswith("/lab/tree/lessons/START_HERE.ipynb"), resp.geturl()
        lessons = json.loads(get(f"{url}/api/contents/lessons?token={TOKEN}"))
        names = {c["name"] for c in lessons["content"]}
        assert {"zh", "en", "START_HERE.ipynb"} <= names and "_source" not in names, names
        root = {c["name"] for c in json.loads(get(f"{url}/api/contents?token={TOKEN}"))["content"]}
        assert "lessons" in root and not any(n.endswith(".egg-info") for n in root), root
