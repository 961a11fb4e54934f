"""The documentation site builds with no warnings, a broken link fails the build, and the service serves
the built site under /docs/guide (or says how to build it)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest
import yaml

from api.app import create_app
from api.cli.commands import COMMANDS
from api.docs import GUIDE_PATH
from api.settings import Settings
from tests.api.test_user_messages import ISSUE_NUMBER
from tests.docs.conftest import DOCS, REPO, build_site


def nav_pages(nav: list) -> list[str]:
    pages = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_built_and_in_the_nav(built_site: Path) -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    assert sorted(pages) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    for page in pages:
        html = built_site / re.sub(r"(index)?\.md$", "", page) / "index.html"
        assert html.is_file(), page


def test_the_command_line_page_lists_every_command() -> None:
    listed = re.findall(r"^\| `([a-z-]+)` \|", (DOCS / "cli.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert listed == [entry.name for entry in COMMANDS]


def test_no_page_cites_an_internal_issue_number() -> None:
    # The pages are read by users (also at /docs/guide), who cannot look the project's issues up.
    found = [f"{page.relative_to(REPO)}: {m[0]!r}" for page in [REPO / "README.md", *DOCS.rglob("*.md")]
             for m in ISSUE_NUMBER.finditer(page.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


# A claim of how fast this project's own code runs (a search, an answer, a start-up, a test run) ...
SPEED_CLAIM = re.compile(
    r"\b(answer(?:s|ed)?\s+(?:in|with)|p99|is\s+ready\s+in|(?:takes?|took|runs?\s+in|searches\s+in|plans\s+in)"
    r"\s+(?:about\s+|well\s+under\s+|under\s+)?[\d.]+(?:-[\d.]+)?\s?(?:s|ms|min|minutes|seconds)\b"
    r"|about\s+[\d.]+(?:-[\d.]+)?\s?(?:s|ms|minutes?|seconds)\b|about\s+a\s+minute)", re.IGNORECASE)
# ... names, in its paragraph, the machine it was measured on.
MACHINE = re.compile(r"\d+\s+cores?\b|\d+-core|\bcores?\s+of\b|machine\b"
                     r"|\bon\s+(?:one|an?|\d+)\s+(?:H100|H200|A100|B200|MI300X|GPU)", re.IGNORECASE)


def test_every_speed_claim_names_its_machine() -> None:
    unlabelled = []
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for paragraph in re.split(r"\n\s*\n", page.read_text(encoding="utf-8")):
            if paragraph.startswith(("    ", "|", "```")) or MACHINE.search(paragraph):
                continue  # code and tables show output; a paragraph that names its machine is labelled
            unlabelled += [f"{page.relative_to(REPO)}: ...{paragraph[max(0, m.start() - 60):m.end()]}"
                           for m in SPEED_CLAIM.finditer(paragraph)]
    assert not unlabelled, "say which machine measured it (e.g. 'on 2 cores'):\n" + "\n".join(unlabelled)


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "quickstart.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = build_site(config=tmp_path / "mkdocs.yml", site_dir=tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


def guide_client(site_dir: Path, tmp_path: Path) -> httpx.AsyncClient:
    settings = Settings(docs_site_dir=site_dir, data_dir=tmp_path, migrate_on_startup=False)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(settings)), base_url="http://testserver")


@pytest.mark.anyio
async def test_the_service_serves_the_built_site(built_site: Path, tmp_path: Path) -> None:
    async with guide_client(built_site, tmp_path) as client:
        root = await client.get(GUIDE_PATH)
        assert root.status_code == 308 and root.headers["location"] == f"{GUIDE_PATH}/"
        home = await client.get(f"{GUIDE_PATH}/")
        assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")
        assert "fsdp-planner" in home.text and "Quick start" in home.text
        # The page's inline start-up scripts are allowed by their hashes; nothing else inline runs.
        policy = home.headers["content-security-policy"]
        assert "script-src 'self' 'sha256-" in policy and "'unsafe-inline'" not in policy.split(";")[1]
        assert home.headers["x-content-type-options"] == "nosniff"
        # Every local asset the home page names is served (the site needs no internet).
        urls = {u for u in re.findall(r"""(?:src|href)=["']([^"'#]+)""", home.text) if "://" not in u}
        assert any(u.endswith(".js") for u in urls) and any(u.endswith(".css") for u in urls)
        for url in sorted(urls):
            asset = await client.get(urljoin(f"{GUIDE_PATH}/", url), follow_redirects=True)
            assert asset.status_code == 200, url
        page = await client.get(f"{GUIDE_PATH}/planning/tensor-parallel/")
        assert page.status_code == 200 and "Tensor parallelism" in page.text
        folder = await client.get(f"{GUIDE_PATH}/planning")
        assert folder.status_code == 308 and folder.headers["location"] == f"{GUIDE_PATH}/planning/"
        missing = await client.get(f"{GUIDE_PATH}/no-such-page/", headers={"accept": "text/html"})
        assert missing.status_code == 404 and "no page at /docs/guide/no-such-page/" in missing.text
        outside = await client.get(f"{GUIDE_PATH}/..%2F..%2Fpyproject.toml")
        assert outside.status_code == 404 and "[project]" not in outside.text


@pytest.mark.anyio
async def test_an_unbuilt_site_answers_how_to_build_it(tmp_path: Path) -> None:
    async with guide_client(tmp_path / "site", tmp_path) as client:
        page = await client.get(f"{GUIDE_PATH}/", headers={"accept": "text/html"})
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "mkdocs build" in page.text and "FSDP_PLANNER_DOCS_SITE_DIR" in page.text
        assert str((tmp_path / "site").resolve()) in page.text


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_every_dashboard_page_links_the_guide(built_site: Path, tmp_path: Path) -> None:
    settings = Settings(docs_site_dir=built_site, data_dir=tmp_path)
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        page = await client.get("/accuracy")
        assert page.status_code == 200
        links = re.findall(r'<a href="(/docs/guide/)">Guide</a>', page.text)
        assert len(links) == 2  # the top bar's nav and the footer
        guide = await client.get(links[0])
        assert guide.status_code == 200 and "Quick start" in guide.text
