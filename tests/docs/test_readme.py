"""The README is the front door: under 250 lines, its two set-up commands scripts that exist, its tour the
quick start's, and every link it has a file of the repository."""

from __future__ import annotations

import os
import re

import yaml

from tests.docs.conftest import DOCS, REPO
from tests.docs.test_site import nav_pages

README = (REPO / "README.md").read_text(encoding="utf-8")


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert match, f"no '## {title}' section"
    return match[1]


def commands(text: str) -> list[str]:
    """The indented lines a reader types (not the output shown after them)."""
    lines = [line[4:] for line in text.splitlines() if line.startswith("    ")]
    return [line for line in lines if re.match(r"(\. |\./|fsdp-planner |curl |cd |DATA=)", line)]


def test_the_readme_is_under_250_lines() -> None:
    assert len(README.splitlines()) < 250, "move the details into a page of docs/ and link it"


def test_set_up_is_two_commands_that_exist() -> None:
    setup = commands(section(README, "Set up"))
    assert setup == ["./scripts/serve.sh", "./scripts/test.sh"]
    for command in setup:
        script = REPO / command
        assert script.is_file() and os.access(script, os.X_OK), command


def test_the_tour_is_the_quick_starts() -> None:
    tour = commands(section(README, "A five-minute tour"))
    quickstart = commands(section((DOCS / "quickstart.md").read_text(encoding="utf-8"), "A five-minute tour"))
    assert tour == quickstart and len(tour) >= 6
    assert any(c.startswith("fsdp-planner plan ") for c in tour)
    assert any(c.startswith("fsdp-planner launcher ") for c in tour)
    assert any("./launch.sh" in c for c in tour)


def test_every_link_is_a_file_of_the_repository() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15
    for link in local:
        assert (REPO / link).is_file(), link
    # Every section of the site's nav, by its first page (the home page is the README's own summary).
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    sections = {f"docs/{nav_pages([entry])[0]}" for entry in nav} - {"docs/index.md"}
    assert sections - set(local) == set(), "link these sections of the docs from the README"


def test_the_fidelity_section_reads_the_tours_plan() -> None:
    """The interval the section explains is the tour's, as the tour shows it (held to what `plan` prints by
    tests/docs/test_examples.py), and the figures its prose reads out are that interval's."""
    fidelity = section(README, "Fidelity")
    tour = " ".join(section(README, "A five-minute tour").split())
    [quoted] = re.findall(r"`(tokens/s/GPU [^`]+)`", fidelity)
    assert " ".join(quoted.split()) in tour, quoted
    prose = fidelity.split("\n\n    ")[0]  # before the command's output
    assert set(re.findall(r"\d{1,3}(?:,\d{3})+", prose)) == set(re.findall(r"\d{1,3}(?:,\d{3})+", quoted))
    assert "(docs/fidelity.md)" in fidelity
