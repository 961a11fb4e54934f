"""Fixtures of the dashboard suite.

- `client` / `db`: the app in-process (TestClient) on a fresh SQLite file, for the server-side page tests
  (a copy of one migrated per session: the app's start-up still runs its migrations, at head).
- `live_server`: `uvicorn` in a subprocess on a free port with its own SQLite file, for the browser tests.
- `browser` / `page`: Debian's Chromium (`/usr/bin/chromium`) driven by playwright; never downloaded. A
  `page` fails its test on any console error or uncaught exception, and `screenshot()` keeps a full-page
  capture under test-artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.app import create_app
from api.db.session import create_db_engine, create_session_factory
from api.settings import SQLITE_FILE_NAME, Settings
from tests.live_server import running_server
from tests.migrated_database import migrate_empty_sqlite

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR = REPO_ROOT / "test-artifacts" / "screenshots"
CHROMIUM = Path(os.environ.get("FSDP_PLANNER_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]

# Cheap inputs: searched in well under a second.
GPT2_FORM = {"model": "gpt2", "num_nodes": "1", "gpus_per_node": "8", "gpu": "H100-SXM-80GB",
             "seq_len": "512", "global_batch_tokens": "4096"}
DEBUG_CPU_FORM = {"model": "llama-debug", "num_nodes": "1", "gpus_per_node": "2", "gpu": "cpu",
                  "seq_len": "512", "global_batch_tokens": "4096"}


@dataclass
class Database:
    """Direct ORM access to the database a server uses (to seed uploads made by other services)."""

    url: str
    _factory: Any = field(init=False, repr=False)
    _engine: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._engine = create_db_engine(self.url, pool_size=1, max_overflow=0)
        self._factory = create_session_factory(self._engine)

    def session(self) -> Session:
        return self._factory()

    def dispose(self) -> None:
        self._engine.dispose()


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite file at the schema's head, migrated once per session (one to three seconds a
    migration on the 2-core CI box, once per page test before)."""
    return migrate_empty_sqlite(tmp_path_factory.mktemp("migrated") / SQLITE_FILE_NAME)


@pytest.fixture
def app_settings(tmp_path: Path, migrated_database: Path) -> Settings:
    """A fresh data directory whose database is a copy of the migrated empty one."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copyfile(migrated_database, data_dir / SQLITE_FILE_NAME)
    return Settings(data_dir=data_dir)


@pytest.fixture
def client(app_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(app_settings)) as test_client:
        yield test_client


@pytest.fixture
def db(client: TestClient, app_settings: Settings) -> Iterator[Database]:
    database = Database(app_settings.resolved_database_url)
    yield database
    database.dispose()


def create_plan(client: TestClient | httpx.Client, **overrides: str) -> int:
    """Create a plan through the dashboard form; the plan's id."""
    response = client.post("/plans/new", data={**GPT2_FORM, **overrides}, follow_redirects=False)
    assert response.status_code == 303, response.text
    match = re.fullmatch(r"/plans/(\d+)(\?existing=1)?", response.headers["location"])
    assert match, response.headers["location"]
    return int(match.group(1))


@dataclass
class LiveServer:
    url: str
    db: Database
    log: Path


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real uvicorn process serving the app on a fresh SQLite database (one per test module)."""
    data_dir = tmp_path_factory.mktemp("live-data")
    log = data_dir / "server.log"
    env = {**os.environ, "FSDP_PLANNER_DATA_DIR": str(data_dir), "FSDP_PLANNER_LOG_LEVEL": "warning"}
    env.pop("DATABASE_URL", None)
    env.pop("FSDP_PLANNER_DATABASE_URL", None)
    with running_server(env=env, log=log) as url:
        database = Database(f"sqlite:///{data_dir / SQLITE_FILE_NAME}")
        yield LiveServer(url=url, db=database, log=log)
        database.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Per module, not per session: a sync playwright keeps its asyncio loop set on the main thread while
    # it is open, and every async test (anyio) or other playwright user that runs later in the same
    # process fails ("another loop is running") until it closes.
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium); "
                    "scripts/test.sh does this on CI")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@dataclass
class BrowserPage:
    """A playwright page plus what it logged; `screenshot(name)` saves a full-page capture."""

    page: Any
    errors: list[str]
    expected_statuses: set[int] = field(default_factory=set)
    """HTTP statuses a test expects a document to answer with (e.g. 422 for a refused form): Chromium
    logs "Failed to load resource" for those, which is not an error of the page."""

    def record_console(self, message: Any) -> None:
        if message.type != "error":
            return
        status = re.search(r"the server responded with a status of (\d{3})", message.text)
        is_document = message.location.get("url") == self.page.url
        if status and is_document and int(status.group(1)) in self.expected_statuses:
            return
        self.errors.append(f"console.error: {message.text} ({message.location.get('url')})")

    def follow(self, selector: str) -> None:
        """Click a link and wait until its page has loaded: a bare click returns before the browser
        leaves the page, so what a test reads next could still be the old page's."""
        with self.page.expect_navigation():
            self.page.click(selector)

    def screenshot(self, name: str) -> Path:
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOT_DIR / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def page_factory(browser: Any) -> Iterator[Callable[..., BrowserPage]]:
    """New pages in fresh contexts (laptop-sized unless told); each test fails on console errors."""
    opened: list[tuple[Any, BrowserPage]] = []

    def make(**context_options: Any) -> BrowserPage:
        context = browser.new_context(
            accept_downloads=True, **({"viewport": {"width": 1366, "height": 900}} | context_options)
        )
        # A guard against a hang, not a speed target: full-page captures of the longest pages take
        # over 15 s while the torch.distributed half of the suite shares the 2 cores.
        context.set_default_timeout(60_000)
        page = context.new_page()
        wrapped = BrowserPage(page=page, errors=[])
        page.on("console", wrapped.record_console)
        page.on("pageerror", lambda exc: wrapped.errors.append(f"uncaught: {exc} at {page.url}"))
        opened.append((context, wrapped))
        return wrapped

    yield make
    errors = [error for _, wrapped in opened for error in wrapped.errors]
    for context, _ in opened:
        context.close()
    assert not errors, "the pages logged errors:\n" + "\n".join(errors)


@pytest.fixture
def page(page_factory: Callable[..., BrowserPage]) -> BrowserPage:
    return page_factory()
