"""The course site: built from executed notebooks, every page renders in headless Chromium and every figure loads.

The fast tests build a site from two short notebooks written here. ``MINISPEC_SITE=DIR`` also checks the real
site built in DIR (CI builds it once with ``python -m minispec.course.site --out DIR``, the same run that checks the
lessons). Chromium is Debian's package (/usr/bin/chromium); without it these tests skip, except under CI.
"""

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from minispec.course.site import LessonError, build

LESSONS = Path(__file__).parents[2] / "lessons"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Injected into a copy of each page: after the load event, what rendered, as data attributes on <html>.
PROBE = """<script>
window.addEventListener("load", () => {
  const d = document.documentElement.dataset, imgs = [...document.images];
  const ok = i => i.complete && i.naturalWidth > 0;
  d.images = imgs.length;
  d.imagesLoaded = imgs.filter(ok).length;
  d.broken = imgs.filter(i => !ok(i)).map(i => i.getAttribute("src").slice(0, 40)).join(" ");
  d.text = document.body.innerText.trim().length;
  d.maths = document.querySelectorAll("math").length;
  d.mathsDrawn = [...document.querySelectorAll("math")].filter(m => m.getBoundingClientRect().width > 0).length;
  d.folded = [...document.querySelectorAll("details:not([open])")]  // closed, with an answer inside
    .filter(x => x.textContent.trim().length > x.querySelector("summary").textContent.trim().length + 10).length;
  d.probed = "yes";
});
</script>"""

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file() and not os.environ.get("CI"),
                                reason="no Chromium: apt-get install -y chromium (.ci/run installs it)")


def chromium(tmp: Path, *args: str) -> str:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # a fresh profile for every run
    out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                         timeout=120)
    shutil.rmtree(profile, ignore_errors=True)
    return out.stdout


def probe(page: Path, tmp: Path) -> dict:
    """Open a copy of ``page`` (beside it, so relative paths hold) with the probe; return what it saw."""
    copy = page.with_name(f".probe-{page.name}")
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        dom = chromium(tmp, "--virtual-time-budget=10000", "--dump-dom", copy.as_uri())
    finally:
        copy.unlink()
    tag = re.search(r"<html[^>]*>", dom)
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', tag.group(0))) if tag else {}
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    return attrs | {"title": title.group(1).strip() if title else ""}


def judge(name: str, seen: dict) -> list[str]:
    """Why a probed page did not render, or which of its figures or formulas did not load; [] if none."""
    if seen.get("probed") != "yes":
        return [f"{name}: the page did not load"]
    out = []
    if not seen["title"] or int(seen["text"]) < 20:
        out.append(f"{name}: blank (title {seen['title']!r}, {seen['text']} characters of text)")
    if seen["images-loaded"] != seen["images"]:
        out.append(f"{name}: {seen['images-loaded']} of {seen['images']} images loaded; broken: {seen['broken']}")
    if seen["maths-drawn"] != seen["maths"]:
        out.append(f"{name}: {seen['maths-drawn']} of {seen['maths']} formulas drawn")
    return out


def page_problems(page: Path, tmp: Path) -> list[str]:
    return judge(page.name, probe(page, tmp))


def static_problems(site: Path) -> list[str]:
    """Network resources (a static site must need none) and relative links to files that are not there."""
    out = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r'<(script|link|img|iframe|source)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]+)"', text):
            out.append(f"{page.relative_to(site)}: <{m.group(1)}> loads {m.group(2)}")
        css = re.findall(r"url\(['\"]?((?:https?:)?//[^)'\"]+)", text)
        out += [f"{page.relative_to(site)}: CSS loads {u}" for u in css]
        for href in re.findall(r'<a href="([^"#:]+)[^"]*"', text):
            if not (page.parent / href).is_file():
                out.append(f"{page.relative_to(site)}: link to {href}, which is not in the site")
    return out


def nonblank(png: Path) -> bool:
    """A screenshot shows something: several colours, and more than 1 % of its pixels not the background."""
    import numpy as np
    from matplotlib.image import imread

    img = imread(png)[..., :3]  # (H, W, 3) floats in 0..1
    background = np.median(img.reshape(-1, 3), axis=0)  # (3,)
    drawn = (np.abs(img - background).sum(-1) > 0.1).mean()
    return drawn > 0.01 and len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 16


def screenshot(page: Path, tmp: Path) -> Path:
    png = tmp / f"{page.stem}.png"
    chromium(tmp, "--window-size=1200,1000", "--hide-scrollbars", f"--screenshot={png}", page.as_uri())
    assert png.is_file(), f"Chromium wrote no screenshot of {page}"
    return png


def notebook(path: Path, *cells: tuple[str, str]):
    nb = {"cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": src}
                    | ({"outputs": [], "execution_count": None} if kind == "code" else {})
                    for i, (kind, src) in enumerate(cells)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


FIGURE = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('{}')\nplt.show()"


@pytest.fixture(scope="module")
def small_site(tmp_path_factory):
    """Two short lessons, a solution, a cheat sheet and a drill, executed and built."""
    src, site = tmp_path_factory.mktemp("lessons"), tmp_path_factory.mktemp("site")
    notebook(src / "00_first.ipynb",
             ("markdown", "# 00 · First\n\nSome maths, $E = (1 - \\alpha^{\\gamma+1}) / (1 - \\alpha)$, and\n\n"
                          "$$t(B, T) = \\max\\left(\\frac{W}{bw}, \\frac{2PBT}{peak}\\right)$$\n\n"
                          "Next: [lesson 01](01_second.ipynb); later: [lesson 07](07_not_written.ipynb)."),
             ("code", "print(sum(range(10)))"), ("code", FIGURE.format("first")))
    notebook(src / "01_second.ipynb", ("markdown", "# 01 · Second\n\nExercises: `solutions/00_first.py`."),
             ("code", FIGURE.format("second")), ("code", "from pathlib import Path\nprint(Path.cwd().name)"),
             ("code", "import os\nprint('threads', os.environ.get('OMP_NUM_THREADS'))"))
    (src / "solutions").mkdir()
    (src / "solutions" / "00_first.py").write_text("print('a worked solution')\n")
    (src / "cheat_sheet.md").write_text("# Cheat sheet\n\n| what | formula |\n| --- | --- |\n| tokens per step | "
                                        "$E = (1 - \\alpha^{\\gamma+1}) / (1 - \\alpha)$ |\n\nAsked in the "
                                        "[drill](interview_drill.md); derived in [lesson 00](00_first.ipynb).\n")
    (src / "interview_drill.md").write_text("# Drill\n\n### 1. Why?\n\n<details><summary>Answer</summary>\n\n"
                                            "Because, see [lesson 00](00_first.ipynb).\n\n</details>\n")
    return build(site, src, timeout=120, jobs=2), site, src  # two lessons at once, as CI builds it


def test_build_writes_an_index_the_lessons_in_order_the_cheat_sheet_the_drill_and_the_solutions(small_site):
    pages, site, src = small_site
    assert [p.relative_to(site).as_posix() for p in pages] == [
        "index.html", "00_first.html", "01_second.html", "cheat_sheet.html", "interview_drill.html",
        "solutions/00_first.html"]
    first, second = (site / "00_first.html").read_text(), (site / "01_second.html").read_text()
    assert "45" in first and f"<pre>{src.name}\n" in second  # executed, in the lessons folder
    assert "threads 1" in second  # run two at once, each kernel on one OpenMP thread
    assert 'href="01_second.html"' in first and 'href="00_first.html"' in second  # previous / next
    assert 'href="cheat_sheet.html"' in second and 'href="index.html"' in first  # the last lesson's next page
    assert 'href="interview_drill.html"' in (site / "cheat_sheet.html").read_text()
    assert '<span class="unbuilt"' in first and 'href="07_not_written' not in first  # a lesson not written yet
    assert 'href="solutions/00_first.html"' in second
    assert first.count("<math") == 2 and "\\alpha" not in first  # TeX became MathML
    assert static_problems(site) == []


def test_the_cheat_sheet_is_a_page_linked_from_the_index_with_its_formulas_drawn(small_site, tmp_path):
    _, site, _ = small_site
    index, sheet = (site / "index.html").read_text(), (site / "cheat_sheet.html").read_text()
    assert 'href="cheat_sheet.html"' in index and "<title>Cheat sheet</title>" in sheet
    assert 'href="interview_drill.html"' in sheet and 'href="00_first.html"' in sheet  # its links point at pages
    assert sheet.count("<math") == 1 and "<table" in sheet  # the formula drawn, the table a table
    assert page_problems(site / "cheat_sheet.html", tmp_path) == []


def test_every_page_renders_with_its_figures_and_formulas(small_site, tmp_path):
    pages, site, _ = small_site
    assert [p for page in pages for p in page_problems(page, tmp_path)] == []
    seen = {page.name: probe(page, tmp_path) for page in pages[1:3]}
    assert [seen[name]["images"] for name in ("00_first.html", "01_second.html")] == ["1", "1"]
    assert seen["00_first.html"]["maths"] == "2"
    assert probe(site / "interview_drill.html", tmp_path)["folded"] == "1"


def test_a_broken_figure_a_blank_page_and_a_network_script_are_caught(small_site, tmp_path):
    _, site, _ = small_site
    bad = tmp_path / "bad"
    shutil.copytree(site, bad)
    page = bad / "00_first.html"
    page.write_text(page.read_text().replace("<main>", '<main><img src="missing.png"><img src="data:image/png;base64,'
                                             'iVBORw0KGgo=">', 1))
    assert page_problems(page, tmp_path) == [f"{page.name}: 1 of 3 images loaded; broken: missing.png data:image/png;"
                                             f"base64,iVBORw0KGgo="]
    blank = bad / "blank.html"
    blank.write_text("<!DOCTYPE html><html><head><title></title></head><body></body></html>")
    assert "blank" in page_problems(blank, tmp_path)[0]
    assert not nonblank(screenshot(blank, tmp_path))
    page.write_text(page.read_text().replace("</head>", '<script src="https://cdn.example/x.js"></script></head>'))
    assert static_problems(bad)[0] == "00_first.html: <script> loads https://cdn.example/x.js"


def test_screenshot_of_a_lesson_is_not_blank(small_site, tmp_path):
    _, site, _ = small_site
    assert nonblank(screenshot(site / "00_first.html", tmp_path))


def test_a_failing_cell_names_its_notebook_and_cell_after_every_lesson_ran(tmp_path):
    src = tmp_path / "lessons"
    src.mkdir()
    notebook(src / "00_fine.ipynb", ("markdown", "# fine"), ("code", "x = 1"))
    notebook(src / "01_broken.ipynb", ("markdown", "# broken"), ("code", "x = 1"), ("code", "1 / 0  # oops"))
    notebook(src / "02_also_broken.ipynb", ("code", "assert False, 'pinned number moved'"))
    with pytest.raises(LessonError) as e:
        build(tmp_path / "site", src, timeout=60, jobs=2)
    msg = str(e.value)
    assert msg.startswith("2 of 3 lessons failed")
    assert "01_broken.ipynb, cell 3 of 3 ('1 / 0  # oops') raised ZeroDivisionError" in msg
    assert "02_also_broken.ipynb, cell 1 of 1" in msg and "AssertionError: pinned number moved" in msg
    assert not (tmp_path / "site" / "index.html").exists()


def test_bad_input_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="no lessons"):
        build(tmp_path / "site", tmp_path / "nowhere")
    notebook(tmp_path / "00_x.ipynb", ("code", "while True: pass"))
    with pytest.raises(ValueError, match="timeout"):
        build(tmp_path / "site", tmp_path, timeout=0)
    for jobs in (0, 1.5, True):
        with pytest.raises(ValueError, match="jobs"):
            build(tmp_path / "site", tmp_path, jobs=jobs)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        build(tmp_path / "file", tmp_path)


# A code cell that draws: it must leave at least one figure on its lesson's page.
DRAWS = re.compile(r"^[^#\n]*(?:plt\.show\(\)|\bplot_\w+\(|\bplots\.\w+\()", re.M)


def drawing_cells(notebook: Path) -> int:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum(c["cell_type"] == "code" and bool(DRAWS.search("".join(c["source"]))) for c in cells)


def unresolved_links(site: Path, lessons: Path) -> list[str]:
    """Links the build turned into plain text: each must name a file that exists beside the lessons (the README,
    a source file), and none may name a lesson, a solution or the drill, which the site must carry."""
    out = []
    for page in sorted(site.rglob("*.html")):
        for target in re.findall(r'class="unbuilt" title="([^"]*): not part of this site"', page.read_text("utf-8")):
            target = html.unescape(target)
            course_page = re.match(r"(solutions/)?\d\d_\w+\.(ipynb|py)$|(interview_drill|cheat_sheet)\.md$", target)
            if course_page or not (lessons / target).exists():
                out.append(f"{page.relative_to(site)}: link to {target}, which does not resolve")
    return out


def test_the_checks_of_the_real_site_catch_a_lost_figure_and_a_dead_link(small_site, tmp_path):
    """drawing_cells counts the cells that must leave a figure; unresolved_links flags a link the build could not
    point at a page, unless it names a file beside the lessons."""
    _, site, src = small_site
    assert [drawing_cells(nb) for nb in sorted(src.glob("*.ipynb"))] == [1, 1]
    assert unresolved_links(site, src) == ["00_first.html: link to 07_not_written.ipynb, which does not resolve"]
    (src / "07_not_written.ipynb").write_text("{}")  # a lesson file the build never rendered: still a dead link
    assert len(unresolved_links(site, src)) == 1
    (src / "07_not_written.ipynb").unlink()


@pytest.mark.skipif(not os.environ.get("MINISPEC_SITE"), reason="MINISPEC_SITE is not set (CI builds the real site)")
def test_the_real_site(tmp_path):
    """Every lesson's page with every figure its cells draw, every relative link resolved, every drill answer folded
    out of sight, and screenshots of the index, a lesson and the drill that show something."""
    site = Path(os.environ["MINISPEC_SITE"]).resolve()
    lessons = sorted(p.stem for p in LESSONS.glob("[0-9][0-9]_*.ipynb"))
    pages = sorted(site.rglob("*.html"))
    assert {p.stem for p in site.glob("[0-9][0-9]_*.html")} == set(lessons), "one page per lesson"
    assert (site / "index.html").is_file() and (site / "interview_drill.html").is_file()
    assert (site / "cheat_sheet.html").is_file() and 'href="cheat_sheet.html"' in (site / "index.html").read_text()
    assert static_problems(site) == [] and unresolved_links(site, LESSONS) == []
    seen = {page.relative_to(site).as_posix(): probe(page, tmp_path) for page in pages}
    assert [p for name, found in seen.items() for p in judge(name, found)] == []
    lost = {stem: (int(seen[f"{stem}.html"]["images-loaded"]), drawing_cells(LESSONS / f"{stem}.ipynb"))
            for stem in lessons}
    assert {stem: n for stem, n in lost.items() if n[0] < n[1]} == {}, "(figures on the page, cells that draw)"
    drill = (LESSONS / "interview_drill.md").read_text(encoding="utf-8")
    questions = len(re.findall(r"^#{2,4} +\d+\.", drill, re.M))
    assert int(seen["interview_drill.html"]["folded"]) == drill.count("<details>") == questions > 25
    for page in ("index.html", f"{lessons[min(4, len(lessons) - 1)]}.html", "interview_drill.html"):
        assert nonblank(screenshot(site / page, tmp_path)), page
