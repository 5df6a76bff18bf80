"""The README's layout table against the files on disk: it names every module under bert_tf/ and every
file under run/ and scripts/, and every path it names exists. Also: the README is the front door (the
two commands first, at most 200 lines, every guide in docs/ linked), and every relative link in the
README and the guides reaches an existing file and heading. Static: the standard library only (no
TensorFlow), well under a second."""
import functools
import re

from conftest import REPO

README = REPO / "README.md"
MAX_README_LINES = 200
FENCE = re.compile(r"^ *```.*?^ *```[^\n]*$", re.S | re.M)


def section(text, title):
    """The text under the level-2 heading `## title`, up to the next level-2 heading."""
    found = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", FENCE.sub("", text), re.S | re.M)
    assert found, f"README.md has no '## {title}' section"
    return found[1]


def layout_paths():
    """Every path the layout table names: the backticked names in each row's first cell."""
    rows = [line for line in section(README.read_text(), "Layout").splitlines() if line.startswith("|")]
    assert len(rows) > 2 and re.fullmatch(r"\|[-| :]+\|", rows[1]), "the Layout section has no table"
    paths = []
    for row in rows[2:]:
        first = row.strip("|").split("|")[0]
        names = re.findall(r"`([^`]+)`", first)
        assert names, f"a layout row without a path in its first cell: {row}"
        paths += names
    return paths


def files_under(folder):
    """Files under REPO/folder, relative to REPO, leaving out caches, hidden and editor files."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts
                  and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
                  and not p.name.endswith(("~", ".pyc", ".swp")))


def test_every_path_the_layout_table_names_exists():
    paths = layout_paths()
    assert len(paths) == len(set(paths)), sorted(p for p in paths if paths.count(p) > 1)
    missing = [p for p in paths if not ((REPO / p).is_dir() if p.endswith("/") else (REPO / p).is_file())]
    assert not missing, f"the README's layout table names what does not exist (folders end in /): {missing}"


def test_the_layout_table_names_every_module():
    """Every .py under bert_tf/ by its path; a package's __init__.py may be covered by naming the
    package's folder (`bert_tf/data/`)."""
    named = set(layout_paths())
    unnamed = [f for f in files_under("bert_tf") if f.endswith(".py") and f not in named
               and not (f.endswith("/__init__.py") and f[:-len("__init__.py")] in named)]
    assert not unnamed, f"modules missing from the README's layout table: {unnamed}"


def test_the_layout_table_names_every_script():
    """Every file under run/ and scripts/ by its path, or by naming a folder inside them that holds it
    (`scripts/horovod_patches/`); run/ and scripts/ themselves cover nothing."""
    named = set(layout_paths())
    folders = [p for p in named if p.endswith("/") and p.count("/") > 1 and p.startswith(("run/", "scripts/"))]
    unnamed = [f for f in files_under("run") + files_under("scripts")
               if f not in named and not any(f.startswith(folder) for folder in folders)]
    assert not unnamed, f"scripts missing from the README's layout table: {unnamed}"


def test_the_readme_is_the_front_door():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail into a guide in docs/"
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first and first.start() < text.index("\n## "), "the README must open with the two commands"
    commands = [re.sub(r"\s*#.*$", "", line).strip() for line in first[1].splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"], commands
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)[)#]", text))
    guides = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert not guides - linked, f"guides the README does not link: {sorted(guides - linked)}"


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def anchors(path):
    """The anchors of a Markdown file's headings (those in code blocks are not headings)."""
    return {slug(h) for h in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text()), re.M)}


def test_links_between_the_readme_and_the_guides_resolve():
    broken = []
    for doc in [README, *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", doc.read_text()))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                                   # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
