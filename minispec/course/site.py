"""Execute the lessons and render them, with the cheat sheet and the drill, as a static HTML site that needs no network.

:func:`build` runs every ``lessons/NN_*.ipynb`` in order, each in a fresh ``python3`` kernel whose working
directory is the lessons folder (as nbmake runs them), and raises :class:`LessonError` naming the notebook
and the cell of every cell that raised. CI executes the lessons once, here, both to check them and to build
the site: ``python -m minispec.course.site --out site``. It writes

    index.html               the lessons in order, with the seconds each took to run
    NN_name.html             one page per lesson: code, outputs, figures (PNG, embedded), linked
                             previous / index / next
    cheat_sheet.html         lessons/cheat_sheet.md: the formulas, the reference numbers, the decision table
    interview_drill.html     lessons/interview_drill.md, its answers folded in <details>
    solutions/NN_name.html   the worked solutions of each lesson's exercises, as highlighted source

The pages are nbconvert's ``lab`` template without the parts that load from a CDN (require.js, MathJax,
the widget manager, mermaid): maths in Markdown ($...$ and $$...$$) is converted to MathML when the site is
built, which browsers draw themselves, and figures are embedded in the page.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LESSON_GLOB = "[0-9][0-9]_*.ipynb"  # lessons/00_quickstart.ipynb ...; solutions/ and checkpoints are not lessons
DRILL = "interview_drill.md"
CHEAT_SHEET = "cheat_sheet.md"
PAGES = {"cheat_sheet": (CHEAT_SHEET, "Cheat sheet"), "interview_drill": (DRILL, "Interview drill")}  # Markdown pages
KERNEL = "python3"
# The kernel's environment. Figures must come back as PNG outputs whatever MPLBACKEND the caller set (CI sets Agg,
# under which plt.show() outputs nothing). PYTEST_CURRENT_TEST is what a kernel started by nbmake inherits, and what
# minispec.course.plots reads to draw a static figure instead of ipywidgets sliders, which a static page cannot run.
KERNEL_ENV = {"MPLBACKEND": "module://matplotlib_inline.backend_inline",
              "PYTEST_CURRENT_TEST": "minispec.course.site (no frontend)"}

_TEMPLATE = """{%- extends 'index.html.j2' -%}
{% block html_head_js %}{% endblock html_head_js %}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{% block html_head_js_mathjax %}{% endblock html_head_js_mathjax %}
{% block html_head_js_mermaidjs %}{% endblock html_head_js_mermaidjs %}
{% block extra_css %}<style>{{ resources.site_css }}</style>{% endblock extra_css %}
{% block body_header %}{{ super() }}{{ resources.site_nav }}{% endblock body_header %}
{% block body_footer %}{{ resources.site_nav }}{{ super() }}{% endblock body_footer %}
"""
_CSS = """
nav.site { display: flex; justify-content: space-between; gap: 1em; max-width: 1100px; margin: 0.5em auto;
           padding: 0.5em 1em; font: 14px/1.4 system-ui, sans-serif; background: #f3f3f3; border-radius: 4px; }
nav.site a { text-decoration: none; }
.unbuilt { color: #777; border-bottom: 1px dotted #777; }
details { margin: 0.3em 0 1em 0; padding: 0.3em 0.8em; border-left: 3px solid #4c9a4c; background: #f7fbf7; }
summary { cursor: pointer; color: #2d6a2d; }
math[display="block"] { margin: 0.6em 0; }
body.site { max-width: 900px; margin: 2em auto; padding: 0 1em; font: 16px/1.5 system-ui, sans-serif; }
body.site pre { font-size: 13px; line-height: 1.35; overflow-x: auto; }
"""
_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.S)  # Markdown code: no maths inside
# $$display$$ and $inline$; inline maths may wrap onto the next line but never crosses a blank line
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$\w])\$((?:[^$\n]|\n(?![ \t]*\n))+?)\$(?![\w$])", re.S)
_ATTR = re.compile(r'(\s[\w-]+=")([^"]*)(")')
_HREF = re.compile(r'<a href="([^":#]+)(#[^"]*)?"([^>]*)>(.*?)</a>', re.S)  # relative links only
_SOLUTION_CODE = re.compile(r"<code>solutions/([\w.-]+)\.py</code>")


class LessonError(RuntimeError):
    """A lesson's cell raised, timed out or killed its kernel while the site was built."""


def kernel_manager_class():
    """A Jupyter kernel manager whose kernel talks to this process over Unix sockets instead of TCP.

    The default, TCP on localhost without CurveZMQ keys, makes every kernel log "Kernel is running over TCP
    without encryption" once. IPC needs no open port and the socket files sit in the user's runtime folder,
    readable by the user alone, so the cause of the warning goes away rather than the warning. The sockets' path
    must be absolute: the kernel runs in the lessons folder, this process wherever it was started.
    """
    import uuid

    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _transport_default(self):
            return "ipc"

        @default("ip")
        def _ip_default(self):  # socket files <runtime>/minispec-<id>-<port>, removed when the kernel stops
            Path(jupyter_runtime_dir()).mkdir(mode=0o700, parents=True, exist_ok=True)
            return str(Path(jupyter_runtime_dir()) / f"minispec-{uuid.uuid4().hex[:12]}")

    return IPCKernelManager


def build(out_dir="site", lessons_dir=None, timeout=300, execute=True, jobs=1) -> list[Path]:
    """Execute every lesson (unless ``execute`` is False) and write the site to ``out_dir``; return its pages.

    ``lessons_dir``: the folder of ``NN_*.ipynb`` (None: the ``lessons`` folder of this checkout). ``timeout``:
    seconds one cell may run. ``jobs``: lessons run at once, each kernel on one OpenMP thread when more than one
    (CI runs two on its two cores; a lesson's seconds are then its share of a busy machine). Raises
    :class:`LessonError` after running every lesson if any cell failed, naming each failing notebook and cell;
    the index is then not written. Returns the pages written, the index first.
    """
    lessons_dir = Path(lessons_dir) if lessons_dir is not None else Path(__file__).resolve().parents[2] / "lessons"
    out = Path(out_dir)
    notebooks = sorted(lessons_dir.glob(LESSON_GLOB)) if lessons_dir.is_dir() else []
    if not notebooks:
        raise ValueError(f"no lessons ({LESSON_GLOB}) in {lessons_dir}: pass lessons_dir, the folder that holds them")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds per cell, got {timeout!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number of lessons run at once, 1 or more, got {jobs!r}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {out} exists and is not a folder")
    if out.resolve() == lessons_dir.resolve():
        raise ValueError(f"out_dir must not be the lessons folder itself ({out})")
    _check_tools(execute)

    out.mkdir(parents=True, exist_ok=True)
    solutions = {nb.stem: lessons_dir / "solutions" / f"{nb.stem}.py" for nb in notebooks}
    solutions = {stem: path for stem, path in solutions.items() if path.is_file()}
    markdown = {stem: lessons_dir / name for stem, (name, _) in PAGES.items() if (lessons_dir / name).is_file()}
    order = [nb.stem for nb in notebooks] + list(markdown)
    titles, seconds, failures, pages = {}, {}, [], []
    env = {"OMP_NUM_THREADS": "1"} if jobs > 1 else {}

    def run(nb_path):
        start = time.perf_counter()
        try:
            nb = _execute(nb_path, timeout, env) if execute else _read(nb_path)
        except LessonError as e:
            print(f"FAILED {nb_path.name} after {time.perf_counter() - start:.1f} s", flush=True)
            return e, None
        took = time.perf_counter() - start
        if execute:
            print(f"ran {nb_path.name} in {took:.1f} s", flush=True)
        return nb, took

    with ThreadPoolExecutor(jobs) as pool:  # each lesson's kernel is a process of its own; the threads wait on them
        for nb_path, (nb, took) in zip(notebooks, pool.map(run, notebooks)):
            if isinstance(nb, LessonError):
                failures.append(str(nb))
                continue
            seconds[nb_path.stem], titles[nb_path.stem] = took, _title(nb, nb_path.stem)
            pages.append((nb_path.stem, nb))
    if failures:
        raise LessonError(f"{len(failures)} of {len(notebooks)} lessons failed:\n\n" + "\n\n".join(failures))

    for stem, path in markdown.items():
        titles[stem] = PAGES[stem][1]
        pages.append((stem, _markdown_notebook(path.read_text(encoding="utf-8"), titles[stem])))
    written = [out / "index.html"]
    for stem, nb in pages:
        path = out / f"{stem}.html"
        path.write_text(_render(nb, stem, order, titles, solutions), encoding="utf-8")
        written.append(path)
    for stem, source in solutions.items():
        path = out / "solutions" / f"{stem}.html"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_solution_page(source, stem, titles[stem]), encoding="utf-8")
        written.append(path)
    (out / "index.html").write_text(_index(order, titles, seconds, solutions, execute), encoding="utf-8")
    for stale in {*out.glob("[0-9][0-9]_*.html"), *out.glob("solutions/[0-9][0-9]_*.html")} - set(written):
        stale.unlink()  # the page of a lesson that is gone
    return written


def _check_tools(execute: bool):
    """Fail before any work if what the build needs is not installed."""
    try:
        import latex2mathml  # noqa: F401
        import nbconvert  # noqa: F401
        import pygments  # noqa: F401
    except ImportError as e:
        raise ImportError(f"building the course site needs {e.name}: pip install 'minispec-decoding[lessons]' "
                          "(in a checkout: pip install -e '.[lessons]')") from None
    if execute:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        try:
            KernelSpecManager().get_kernel_spec(KERNEL)
        except NoSuchKernel:
            raise ImportError(f"no Jupyter kernel {KERNEL!r} to run the lessons: pip install ipykernel") from None


def _read(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def _execute(path: Path, timeout: float, env: dict | None = None):
    """The notebook at ``path`` with its outputs, run top to bottom in a fresh kernel in its own folder."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb, running = _read(path), {}
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, store_widget_state=False,
                            kernel_manager_class=kernel_manager_class(),
                            resources={"metadata": {"path": str(path.parent.resolve())}},
                            on_cell_start=lambda cell, cell_index: running.update(index=cell_index))
    try:
        client.execute(env={**os.environ, **KERNEL_ENV, **(env or {})})
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        i = running.get("index", 0)
        first = nb.cells[i].source.strip().splitlines()[:1] if nb.cells else []
        what = f"{e.ename}: {e.evalue}" if isinstance(e, CellExecutionError) else f"{type(e).__name__}: {e}"
        trace = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[-25:]  # the traceback's end, no colours
        raise LessonError(f"{path.name}, cell {i + 1} of {len(nb.cells)} ({first[0] if first else 'empty'!r}) "
                          f"raised {what}\n" + "\n".join("    " + line for line in trace)) from None
    return nb


def _title(nb, stem: str) -> str:
    """The first Markdown heading of a notebook, or its file name."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return stem


def _markdown_notebook(text: str, title: str):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
    nb.metadata["title"] = title
    return nb


def _maths_out(nb) -> dict[str, str]:
    """Replace the maths of every Markdown cell by placeholders (in place); return placeholder -> MathML."""
    from latex2mathml.converter import convert

    maths = {}

    def swap(m):
        key = f"minispecmath{len(maths)}x"  # letters and digits only: Markdown leaves it alone
        tex, display = (m.group(1), "block") if m.group(1) is not None else (m.group(2), "inline")
        maths[key] = convert(tex.strip(), display=display)
        return key

    for cell in nb.cells:
        if cell.cell_type == "markdown" and "$" in cell.source:
            parts = _CODE.split(cell.source)  # odd parts are code
            cell.source = "".join(p if i % 2 else _MATH.sub(swap, p) for i, p in enumerate(parts))
    return maths


def _maths_in(page: str, maths: dict[str, str]) -> str:
    """Put the MathML back; inside an attribute (a heading's id and anchor) a placeholder becomes nothing."""
    page = _ATTR.sub(lambda m: m.group(1) + re.sub(r"minispecmath\d+x", "", m.group(2)) + m.group(3), page)
    for key, mathml in maths.items():
        if page.count(key) != 1:
            raise RuntimeError(f"maths placeholder {key} appears {page.count(key)} times in the rendered page")
        page = page.replace(key, mathml)
    return page


def _links(page: str, order: list[str], solutions: dict, prefix: str = "") -> str:
    """Point links to lessons, solutions, the cheat sheet and the drill at their pages; a link to a page the site lacks
    becomes plain text marked as not built (a lesson not written yet, a file outside the course)."""
    names = {f"{stem}.ipynb": f"{stem}.html" for stem in order} | {name: f"{stem}.html" for stem, (name, _) in
                                                                     PAGES.items() if stem in order}
    names |= {f"solutions/{stem}.py": f"solutions/{stem}.html" for stem in solutions}

    def fix(m):
        target, fragment, rest, text = m.group(1), m.group(2) or "", m.group(3), m.group(4)
        if target in names:
            return f'<a href="{prefix}{names[target]}{fragment}"{rest}>{text}</a>'
        if target.endswith(".html"):
            return m.group(0)
        return f'<span class="unbuilt" title="{html.escape(target)}: not part of this site">{text}</span>'

    page = _HREF.sub(fix, page)
    return _SOLUTION_CODE.sub(lambda m: (f'<a href="{prefix}solutions/{m.group(1)}.html">{m.group(0)}</a>'
                                         if m.group(1) in solutions else m.group(0)), page)


def _nav(stem: str, order: list[str], titles: dict, prefix: str = "") -> str:
    i = order.index(stem)
    prev = (f'<a href="{prefix}{order[i - 1]}.html">&larr; {html.escape(titles[order[i - 1]])}</a>'
            if i > 0 else "<span></span>")
    nxt = (f'<a href="{prefix}{order[i + 1]}.html">{html.escape(titles[order[i + 1]])} &rarr;</a>'
           if i + 1 < len(order) else "<span></span>")
    return f'<nav class="site">{prev}<a href="{prefix}index.html">index</a>{nxt}</nav>'


def _render(nb, stem: str, order: list[str], titles: dict, solutions: dict) -> str:
    """One lesson (or a Markdown page: the cheat sheet, the drill) as a page: nbconvert's lab template without its CDN
    scripts."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    nb.metadata.pop("widgets", None)  # widget state would pull the widget manager from a CDN
    nb.metadata["title"] = titles[stem]
    maths = _maths_out(nb)
    nav = _nav(stem, order, titles)
    if stem in solutions:
        nav = nav.replace("</nav>", f'</nav><nav class="site"><span>Worked solutions to the exercises: '
                                    f'<a href="solutions/{stem}.html">solutions/{stem}.py</a></span></nav>')
    exporter = HTMLExporter(template_name="lab", template_file="minispec_site.html.j2", embed_images=False,
                            extra_loaders=[DictLoader({"minispec_site.html.j2": _TEMPLATE})])
    page, _ = exporter.from_notebook_node(nb, resources={"site_nav": nav, "site_css": _CSS})
    return _links(_maths_in(page, maths), order, solutions)


def _page(title: str, body: str) -> str:
    """A plain page in the site's own small stylesheet."""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1.0">\n'
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n"
            f'<body class="site">\n{body}\n</body>\n</html>\n')


def _solution_page(source: Path, stem: str, title: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    code = highlight(source.read_text(encoding="utf-8"), PythonLexer(), HtmlFormatter(noclasses=True))
    nav = (f'<nav class="site"><a href="../{stem}.html">&larr; {html.escape(title)}</a>'
           f'<a href="../index.html">index</a><span></span></nav>')
    return _page(f"Solutions: {title}", f"{nav}\n<h1>Worked solutions: {html.escape(title)}</h1>\n"
                                        f"<p><code>lessons/solutions/{stem}.py</code>, run by the test suite.</p>\n"
                                        f"{code}\n{nav}")


def _index(order: list[str], titles: dict, seconds: dict, solutions: dict, executed: bool) -> str:
    rows = []
    for stem in (s for s in order if s not in PAGES):
        extra = []
        if stem in seconds and executed:
            extra.append(f"ran in {seconds[stem]:.0f} s")
        if stem in solutions:
            extra.append(f'<a href="solutions/{stem}.html">solutions</a>')
        note = f' <small>({", ".join(extra)})</small>' if extra else ""
        rows.append(f'<li><a href="{stem}.html">{html.escape(titles[stem])}</a>{note}</li>')
    when = "executed top to bottom when this site was built" if executed else "rendered without running them"
    total = f" in {sum(seconds.values()):.0f} s" if executed else ""
    body = (f"<h1>minispec: the course</h1>\n<p>An educational speculative decoder in plain PyTorch, taught in "
            f"{sum(s not in PAGES for s in order)} lessons. Every lesson below was {when}{total}: the "
            f"outputs and figures are the ones it printed on the machine that built the site.</p>\n"
            "<ul>\n" + "\n".join(rows) + "\n</ul>\n")
    if "cheat_sheet" in order:
        body += ('<p>On one page: <a href="cheat_sheet.html">the cheat sheet</a>, the formulas, the reference numbers '
                 'and a decision table, "should I turn speculation on?".</p>\n')
    if "interview_drill" in order:
        body += ('<p>Then test yourself: <a href="interview_drill.html">the interview drill</a>, questions an '
                 "interviewer asks about speculative decoding, with short worked answers folded out of sight.</p>\n")
    return _page("minispec: the course", body)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minispec.course.site", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="site", help="folder to write the site to (default: site)")
    parser.add_argument("--lessons", default=None, help="folder of the lesson notebooks (default: this checkout's)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one cell may run (default: 300)")
    parser.add_argument("--jobs", type=int, default=1, help="lessons run at once (default: 1)")
    parser.add_argument("--no-execute", action="store_true", help="render the notebooks as they are, without running")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        pages = build(args.out, args.lessons, args.timeout, execute=not args.no_execute, jobs=args.jobs)
    except LessonError as e:
        print(f"\n{e}", file=sys.stderr)
        return 1
    print(f"wrote {len(pages)} pages to {args.out}/ in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
