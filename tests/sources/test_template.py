from __future__ import annotations

from pathlib import Path

from clawmem_index.sources.template import copy_template, template_dir


def test_init_copies_the_whole_template(tmp_path: Path) -> None:
    created = dict(copy_template(tmp_path / "new"))
    expected = {str(p.relative_to(template_dir())) for p in template_dir().rglob("*") if p.is_file()}
    assert set(created) == expected and set(created.values()) == {"create"}
    for rel in ("MEMORY.md", "AGENTS.md", "clawmem.toml", "memory/templates/daily-log.md"):
        assert (tmp_path / "new" / rel).is_file()


def test_init_never_overwrites_a_file(tmp_path: Path) -> None:
    (tmp_path / "MEMORY.md").write_text("my own memory")
    result = dict(copy_template(tmp_path))
    assert result["MEMORY.md"] == "keep"
    assert (tmp_path / "MEMORY.md").read_text() == "my own memory"


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "dry"
    result = dict(copy_template(target, dry_run=True))
    assert result and not target.exists()


def test_the_template_teaches_the_memory_habits() -> None:
    agents = (template_dir() / "AGENTS.md").read_text()
    for habit in ("MEMORY.md", "memory/YYYY-MM-DD.md", "compacted"):
        assert habit in agents
    memory = (template_dir() / "MEMORY.md").read_text()
    for section in ("## Preferences", "## Decisions", "## Facts"):
        assert section in memory
