"""The docs' code-block convention: every block runs in the docs test or is marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs_blocks import blocks, console_steps, pages, problem, region

PAGE = """\
# A page

```sh
echo runs
```

<!-- docs-test: skip needs a Kubernetes cluster -->
```sh
kubectl get pods
```

<!-- docs-test: file values.yaml -->

```yaml
replicas: 2
```

````markdown
```python
print("inside another block")
```
````

```
a box without a language
```

```yaml
replicas: 3
```

<!-- docs-test: skip -->
```text
prose in a box
```
"""


def test_every_block_in_the_docs_runs_or_is_marked() -> None:
    """Each fenced block of README.md and docs/*.md is of a kind the docs test runs, or is
    marked `docs-test: skip REASON` / `docs-test: file NAME` on the line above its fence."""
    found = [b for page in pages() for b in blocks(page)]
    assert found
    problems = [p for b in found if (p := problem(b)) is not None]
    assert not problems, "\n".join(problems)


def test_blocks_markers_and_problems_are_found(tmp_path: Path) -> None:
    """The parser reads languages and markers (across blank lines, past nested fences) and
    flags an unmarked box without a language, non-job YAML, and a skip without a reason."""
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    found = blocks(page)
    assert [(b.lang, b.marker, b.argument) for b in found] == [
        ("sh", "", ""),
        ("sh", "skip", "needs a Kubernetes cluster"),
        ("yaml", "file", "values.yaml"),
        ("markdown", "", ""),
        ("", "", ""),
        ("yaml", "", ""),
        ("text", "skip", ""),
    ]
    assert found[3].text == '```python\nprint("inside another block")\n```\n'
    flagged = [b.line for b in found if problem(b) is not None]
    assert flagged == [18, 24, 28, 33]


def test_console_transcripts_split_into_commands_and_output() -> None:
    """A console block is a list of `$ command` lines, each with the output under it."""
    steps = console_steps("$ scheduler validate\n4 jobs OK\n$ true\n$ echo a\na\n\n")
    assert steps == [("scheduler validate", "4 jobs OK"), ("true", ""), ("echo a", "a")]


def test_region_blocks_equal_the_regions_of_their_files(tmp_path: Path) -> None:
    """A `docs-test: region PATH NAME` block must be exactly the lines between the file's
    `region NAME` and `endregion NAME` comments; an edited file or block is flagged."""
    source = tmp_path / "main.go"
    source.write_text("package main\n\n// region hello\n\nfunc hello() {}\n\n// endregion hello\n")
    assert region(source, "hello") == "func hello() {}\n"
    page = tmp_path / "page.md"
    marker = f"<!-- docs-test: region {source} hello -->"  # an absolute path stays one
    page.write_text(
        f"{marker}\n```go\nfunc hello() {{}}\n```\n\n{marker}\n```go\nfunc x() {{}}\n```\n"
    )
    same, edited = blocks(page)
    assert problem(same) is None
    assert "is not region 'hello'" in str(problem(edited))
    with pytest.raises(ValueError, match="region 'nope' needs one 'region nope' comment line"):
        region(source, "nope")
